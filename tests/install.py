"""Which fleetwatch the tests run: the checkout's (editable install) or the built wheel.

The everyday loop (`.venv/bin/pytest`) runs the checkout as edited, through the editable
install; `./dev.sh test`, which CI runs, installs the wheel and sets `WHEEL_RUN` so that the
suite tests what ships. tests/conftest.py stops a run whose import does not match its mode:
tests that silently ran an old installed copy, or a "wheel" run that imported the tree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import fleetwatch

ROOT: Final = Path(__file__).resolve().parents[1]
WHEEL_RUN: Final = "FLEETWATCH_TEST_WHEEL"


def wheel_run() -> bool:
    """True under `./dev.sh test` (the environment variable `WHEEL_RUN` is 1)."""
    return os.environ.get(WHEEL_RUN) == "1"


def imported_source() -> Path:
    """The real path of the fleetwatch package imported (links of the editable install
    resolved)."""
    return Path(fleetwatch.__file__).resolve().parent


def mismatch() -> str | None:
    """Why the imported fleetwatch is not the one this run's mode tests, or None."""
    source = imported_source()
    from_checkout = source == ROOT / "src" / "fleetwatch"
    if wheel_run() and from_checkout:
        return (
            f"{WHEEL_RUN}=1 but fleetwatch is imported from the checkout ({source}): "
            "install the wheel first (./dev.sh test does)"
        )
    if not wheel_run() and not from_checkout:
        return (
            f"fleetwatch is imported from {source}, an installed copy, not this checkout: "
            "the tests would run old code. `.venv/bin/pip install --no-deps "
            "--config-settings editable_mode=strict -e .` (or any ./dev.sh command) puts the "
            f"editable install back; set {WHEEL_RUN}=1 to test an installed wheel on purpose"
        )
    return None
