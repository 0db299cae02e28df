#!/usr/bin/env bash
# fleetwatch developer entry point: sets up what it needs, then runs one thing.
#   ./dev.sh demo   the whole stack on this machine with simulated hardware
#   ./dev.sh test   lint, type checks and the whole test suite
#   ./dev.sh generate [--check]   rewrite every generated file from the tree (--check: report
#                   drift, write nothing)
# Works on a fresh Debian 12 machine that has only python3. As root it installs the
# Debian packages the demo and the tests use; otherwise it names the line to run.
set -euo pipefail
cd "$(dirname "$0")"

# The demo runs these; the tests also need node_exporter (cross-check), Chromium (report
# screenshot), wrk (the benchmarks' scrape load), VictoriaMetrics with vmagent and vmalert
# (the rules on a second engine) and etcd (the kube-apiserver's store).
DEMO_PACKAGES=(python3-venv prometheus prometheus-alertmanager infiniband-diags)
TEST_PACKAGES=("${DEMO_PACKAGES[@]}" prometheus-node-exporter fuse3 chromium wrk victoria-metrics etcd-server)
VENV=.venv

missing_debian_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || printf '%s\n' "$pkg"
    done
}

ensure_debian_packages() {
    local need=$1 missing
    shift
    missing=$(missing_debian_packages "$@" | tr '\n' ' ')
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" -eq 0 ]; then
        echo "dev.sh: installing Debian packages: $missing" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    elif [ "$need" = required ]; then
        echo "dev.sh: missing Debian packages. Run as root, then retry:" >&2
        echo "  sudo apt-get install -y --no-install-recommends $missing" >&2
        exit 1
    else
        echo "dev.sh: without $missing the demo runs the exporter alone; to get the rest:" >&2
        echo "  sudo apt-get install -y --no-install-recommends $missing" >&2
    fi
}

ensure_venv() {
    # $1: the extras to install. Dependencies are installed when pyproject.toml changes;
    # fleetwatch itself is reinstalled (non-editable) every time, so the demo and the
    # tests run the package as it ships, not the source folders.
    local extras=$1 stamp="$VENV/.installed-$1"
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        "$VENV/bin/pip" install -q --upgrade pip "setuptools>=68" wheel
        "$VENV/bin/pip" install -q ".[$extras]"
        if [ "$extras" = dev ]; then
            # helm-sdkpy declares Python 3.12 but works on 3.11 (it wraps the Helm Go library).
            "$VENV/bin/pip" install -q --ignore-requires-python "helm-sdkpy>=0.1"
        fi
        touch "$stamp"
    fi
    # setuptools builds in ./build and ./fleetwatch.egg-info: a module deleted from the tree
    # would survive in the one, and the other would shadow the installed metadata.
    rm -rf build fleetwatch.egg-info
    "$VENV/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall .
    rm -rf build fleetwatch.egg-info
}

case "${1:-}" in
    demo)
        ensure_debian_packages optional "${DEMO_PACKAGES[@]}"
        ensure_venv tainter
        shift
        exec "$VENV/bin/fleetwatch" demo "$@"
        ;;
    test)
        ensure_debian_packages required "${TEST_PACKAGES[@]}"
        ensure_venv dev
        shift
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        # The package as installed, then the tests, benches and generators that use it.
        "$VENV/bin/mypy" -p fleetwatch
        "$VENV/bin/mypy"
        exec "$VENV/bin/pytest" -q "$@"
        ;;
    generate)
        # The one generate step: the install (done once, here) is the tree's, so the rules,
        # dashboards and chart generators all build from the checkout (generate.py).
        ensure_venv dev
        shift
        exec "$VENV/bin/python" generate.py "$@"
        ;;
    *)
        echo "usage: ./dev.sh demo | ./dev.sh test [pytest args] | ./dev.sh generate [--check]" >&2
        exit 2
        ;;
esac
