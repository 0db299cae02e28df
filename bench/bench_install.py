"""What an install costs: site-packages size per extra, top-level import names, and the
exporter's start-up time and RSS from that install.

For each extra it makes a fresh virtualenv, runs `pip install SOURCE[EXTRA]`, and measures
site-packages without pip and setuptools (what an image carries). From the base install it
starts `fleetwatch export --simulate dgx-h100` (or `python -m exporter` for a tree from
before the one-package layout) and reports the time to the first 200 of /readyz and the
RSS after `--settle` seconds. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_install.py                      # this tree, every extra
    .venv/bin/python bench/bench_install.py --source OLD --extras ""   # another checkout
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_CARRIED = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth", "wheel")


def site_packages(venv: Path) -> Path:
    (path,) = venv.glob("lib/python3*/site-packages")
    return path


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def carried(site: Path) -> int:
    """Bytes of site-packages, pip and setuptools excluded."""
    total = 0
    for entry in site.iterdir():
        if entry.name.split("-")[0] in NOT_CARRIED or entry.name.startswith(NOT_CARRIED):
            continue
        total += tree_bytes(entry) if entry.is_dir() else entry.stat().st_size
    return total


def own_top_levels(site: Path) -> list[str]:
    """Top-level names fleetwatch itself installs (from its RECORD)."""
    (record,) = site.glob("fleetwatch-*.dist-info/RECORD")
    names = set()
    for line in record.read_text().splitlines():
        first = line.split(",")[0].split("/")[0]
        if not first.endswith(".dist-info") and first not in ("..", "__pycache__"):
            names.add(first.removesuffix(".py"))
    return sorted(names)


def install(source: Path, extra: str, venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Build in a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info")
        )
        target = f"{copy}[{extra}]" if extra else str(copy)
        result = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", target],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pip install {target} failed:\n{result.stderr}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def exporter_figures(venv: Path, settle: float) -> tuple[float, float]:
    """Seconds from exec to the first ready answer, and RSS (MiB) after `settle` seconds."""
    port = free_port()
    module = "fleetwatch" if (site_packages(venv) / "fleetwatch").is_dir() else "exporter"
    python = venv / "bin" / "python"
    argv = [str(python), "-m", module, "export", f"--web.listen-address=127.0.0.1:{port}"]
    argv += ["--simulate=dgx-h100", "--log.level=warning"]
    start = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = start + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"exporter did not become ready ({argv})") from None
                time.sleep(0.02)
        ready = time.monotonic() - start
        time.sleep(settle)
        return ready, rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree to install")
    parser.add_argument(
        "--extras",
        default=",tainter,report,dashboards",
        help="comma-separated extras to measure; empty name = base install",
    )
    parser.add_argument("--settle", type=float, default=60.0, help="seconds before RSS")
    args = parser.parse_args()
    print(f"source {args.source}  python {sys.version.split()[0]}  settle {args.settle:.0f} s")
    with tempfile.TemporaryDirectory() as tmp:
        for extra in args.extras.split(","):
            venv = Path(tmp) / (extra or "base")
            install(args.source, extra, venv)
            site = site_packages(venv)
            label = f"[{extra}]" if extra else "base"
            names = " ".join(own_top_levels(site))
            print(f"{label:13} {carried(site) / 2**20:7.1f} MiB  fleetwatch installs: {names}")
            if not extra:
                ready, rss = exporter_figures(venv, args.settle)
                print(f"{'':13} exporter ready in {ready:.2f} s, RSS {rss:.1f} MiB after")
            shutil.rmtree(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
