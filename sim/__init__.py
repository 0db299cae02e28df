"""The simulation: a node, a cluster and a fleet that behave like real ones, on a laptop.

Hardware, for `fleetwatch export --simulate`: `scenario` loads and validates scenario files;
`world` turns a scenario and a clock into the state of every simulated device at any
instant; the fake NVML (`fake_nvml`), the kernel log (`kernel_log`), the generated sysfs
tree (`sysfs_tree`) and the fake InfiniBand tools (`bin/`) read that state, so every
collector runs unchanged. The cluster: `kubeapi` (a Kubernetes API) and `kubelet`
(PodResources and kube-state-metrics' pod labels).
The fleet's history for the report: `fleet`. Real servers for the demo, tests and benches:
`loopback_servers` and `stack`. Only `fleet` needs an extra (numpy, from `[report]`); the exporter
imports only the hardware modules, which need the base install alone.
"""

from importlib import resources
from pathlib import Path


def tool_dir() -> Path:
    """The folder of the fake `perfquery` and `ibstat` executables, as installed.

    They ship as package data of this package; an installed package is a plain folder, so
    the path is real and can go first on a collector's tool search path.
    """
    return Path(str(resources.files(__name__).joinpath("bin")))
