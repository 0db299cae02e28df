"""Simulated hardware: a scenario-driven node whose GPUs and fabric move over time.

`scenario` loads and validates scenario files; `world` turns a scenario and a clock into
the state of every simulated device at any instant; the fake NVML and the generated sysfs
tree read that state, so every collector runs unchanged on a laptop.
"""

from importlib import resources
from pathlib import Path


def tool_dir() -> Path:
    """The folder of the fake `perfquery` and `ibstat` executables, as installed.

    They ship as package data of this package; an installed package is a plain folder, so
    the path is real and can go first on a collector's tool search path.
    """
    return Path(str(resources.files(__name__).joinpath("bin")))
