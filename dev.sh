#!/usr/bin/env bash
# fleetwatch developer entry point: sets up what it needs, then runs one thing.
#   ./dev.sh demo   the whole stack on this machine with simulated hardware
#   ./dev.sh test   lint, type checks and the whole test suite
#   ./dev.sh generate [--check]   rewrite every generated file from the tree (--check: report
#                   drift, write nothing)
#   ./dev.sh fuzz [--examples N] [-k EXPR]   every parser's property-based tests (those -k
#                   selects), N examples each (default 10000); each writes its parsers' rows of
#                   docs/reliability.md's parser table as it passes
# Works on a fresh Debian 12 machine that has only python3. As root it installs the
# Debian packages the demo and the tests use; otherwise it names the line to run.
set -euo pipefail
cd "$(dirname "$0")"

# The demo runs these; the tests also need node_exporter (cross-check), Chromium (report
# screenshot), wrk (the benchmarks' scrape load), VictoriaMetrics with vmagent and vmalert
# (the rules on a second engine), etcd (the kube-apiserver's store), Slurm with munge (a
# real cluster on this machine: fleetwatch.sim.slurm, sim/slurm.py) and libfaketime (the wall
# clock stepped under a running exporter: tests/faults/test_exporter_clock_steps.py).
DEMO_PACKAGES=(python3-venv prometheus prometheus-alertmanager infiniband-diags)
TEST_PACKAGES=("${DEMO_PACKAGES[@]}" prometheus-node-exporter fuse3 chromium wrk victoria-metrics etcd-server
    slurm-wlm slurmctld slurmd slurm-client munge faketime)
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
    # $1: the extras to install; $2: how fleetwatch itself goes in. `editable` (the demo,
    # generate, and the everyday loop: `.venv/bin/pytest` runs the code as edited) or
    # `wheel` (`./dev.sh test`: the package as it ships, built from the tree). Dependencies
    # are installed when pyproject.toml changes; fleetwatch itself on every run.
    local extras=$1 mode=$2 stamp="$VENV/.installed-$1"
    # One install at a time: `./dev.sh fuzz` runs in parts, several at once, and two pip
    # runs building in ./build at the same moment break each other. The lock is held on this
    # script's file until the install is done.
    exec 9<"$0"
    flock 9
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
    if [ "$mode" = wheel ]; then
        # setuptools builds in ./build and ./fleetwatch.egg-info: a module deleted from the
        # tree would survive in the one, and the other would shadow the installed metadata.
        rm -rf build fleetwatch.egg-info "$VENV/.editable"
        "$VENV/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall .
        rm -rf build fleetwatch.egg-info
    else
        install_editable
    fi
    flock -u 9
}

package_files() {
    # What the editable install's link tree is made of: the package's files, by name, and
    # pyproject.toml, which maps them into it.
    { cat pyproject.toml
      find src/fleetwatch exporter collectors tainter slurm report rules sim -type f \
          ! -path '*/__pycache__/*' | LC_ALL=C sort
    } | sha1sum
}

install_editable() {
    # strict: a tree of links to the checkout's files (build/__editable__.*), which mypy
    # finds through a plain .pth path (it cannot follow setuptools' default import hook).
    # Edits show at once through the links; the tree is remade only when a file is added,
    # moved or deleted: setuptools empties it first, and a run importing from it at that
    # moment (several `./dev.sh fuzz` at once) would find no fleetwatch.
    # Its output (setuptools' notice about the link tree) shows only when it fails.
    local out files
    files=$(package_files)
    if [ -f "$VENV/.editable" ] && [ "$(cat "$VENV/.editable")" = "$files" ] \
        && compgen -G "build/__editable__.*" >/dev/null; then
        return 0
    fi
    rm -rf build fleetwatch.egg-info
    out=$("$VENV/bin/pip" install -q --no-deps --no-build-isolation \
        --config-settings editable_mode=strict -e . 2>&1) || { echo "$out" >&2; return 1; }
    echo "$files" >"$VENV/.editable"
}

case "${1:-}" in
    demo)
        ensure_debian_packages optional "${DEMO_PACKAGES[@]}"
        ensure_venv tainter editable
        shift
        exec "$VENV/bin/fleetwatch" demo "$@"
        ;;
    test)
        ensure_debian_packages required "${TEST_PACKAGES[@]}"
        # One run against the wheel (what ships: a file left out of it fails here), then the
        # editable install back for the everyday loop, however the run ends.
        ensure_venv dev wheel
        trap install_editable EXIT
        shift
        export FLEETWATCH_TEST_WHEEL=1
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        # The package as installed, then the tests, benches and generators that use it.
        "$VENV/bin/mypy" -p fleetwatch
        "$VENV/bin/mypy"
        # The suite mostly waits on real servers: its modules run on several workers at once
        # (pytest-xdist), each module whole on one worker so its servers start once, the
        # real Slurm clusters' modules on one (tests/conftest.py's scheduler).
        # FLEETWATCH_TEST_WORKERS=0 runs it in one process.
        "$VENV/bin/pytest" -q -n "${FLEETWATCH_TEST_WORKERS:-$((2 * $(nproc)))}" \
            --dist loadfile "$@"
        ;;
    generate)
        # The one generate step: the install is editable, so the rules, dashboards and chart
        # generators all build from the checkout (generate.py).
        ensure_venv dev editable
        shift
        exec "$VENV/bin/python" generate.py "$@"
        ;;
    fuzz)
        # The suite runs tests/fuzz with a few examples per property (profile "ci"); this runs
        # them long (profile "fuzz") and writes what each parser survived into the docs: each
        # property that passes replaces its parsers' rows of the table as it ends, so a long run
        # can be split (-k, or several processes at once) or cut short and keep what it did.
        ensure_venv dev editable
        shift
        examples=10000
        select=()
        while [ $# -gt 0 ]; do
            case "$1" in
                --examples) examples=${2:?--examples needs a number}; shift 2 ;;
                --examples=*) examples=${1#--examples=}; shift ;;
                -k) select=(-k "${2:?-k needs an expression}"); shift 2 ;;
                *) echo "usage: ./dev.sh fuzz [--examples N] [-k EXPR]" >&2; exit 2 ;;
            esac
        done
        # The properties that write a file tree an example (sysfs, PCI, job mapping, configs)
        # run about three times faster on a tmpfs than on a disk.
        if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
            export TMPDIR=/dev/shm
        fi
        # No per-test timeout: a property of N examples runs as long as N takes.
        FLEETWATCH_FUZZ_EXAMPLES=$examples FLEETWATCH_FUZZ_TABLE=docs/reliability.md \
            "$VENV/bin/pytest" -q -p no:cacheprovider --timeout=0 "${select[@]}" tests/fuzz
        ;;
    *)
        echo "usage: ./dev.sh demo | ./dev.sh test [pytest args] | ./dev.sh generate [--check] | ./dev.sh fuzz [--examples N] [-k EXPR]" >&2
        exit 2
        ;;
esac
