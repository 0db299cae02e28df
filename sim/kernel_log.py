"""The simulated node's kernel log, as the Xid and storage collectors read `/dev/kmsg`.

An NVRM Xid record per scenario Xid and a "GPU has fallen off the bus" record per
`gpu_off_bus` fault, stamped with scenario time, the GPU named by the bus id the fake NVML
reports for it.
"""

from __future__ import annotations

import threading

from fleetwatch.collectors.sources.kmsg import FILE_LOOK_SECONDS
from fleetwatch.sim.fake_nvml import simulated_pci_bus_id
from fleetwatch.sim.world import SimulatedNode


class SimulatedKernelLog:
    """The simulated node's kernel log: an NVRM Xid record per scenario Xid and a "GPU has
    fallen off the bus" record per `gpu_off_bus` fault, history included.

    Implements `collectors.sources.kmsg.KernelLog`; unlike NVML events, the kernel log
    keeps the Xids raised before the reader started. Records are stamped with scenario
    time (the node booted at 0), the clock `now()` reads.
    """

    def __init__(self, *, node: SimulatedNode) -> None:
        self._node = node
        self._sent = 0
        self._closed = threading.Event()
        self.opened_at = self.now()

    def now(self) -> float:
        return self._node.now()

    def _new_lines(self) -> list[str]:
        # An Xid sorts before a fall off the bus at the same instant, as the driver logs them.
        events = sorted(
            [(at, 0, gpu, xid) for at, gpu, xid in self._node.xid_events()]
            + [(at, 1, gpu, 0) for at, gpu in self._node.off_bus_events()]
        )
        start, new, self._sent = self._sent, events[self._sent :], len(events)
        return [
            f"{3 if xid else 4},{start + i},{round(at * 1e6)},-;NVRM: "
            + (
                f"Xid (PCI:{simulated_pci_bus_id(gpu)[4:14]}): {xid}, pid='<unknown>', "
                "name=<unknown>, simulated"
                if xid
                else f"GPU {simulated_pci_bus_id(gpu)[4:]}: GPU has fallen off the bus."
            )
            for i, (at, _order, gpu, xid) in enumerate(new)
        ]

    def read(self, timeout: float) -> list[str]:
        lines = self._new_lines()
        if not lines and not self._closed.wait(min(timeout, FILE_LOOK_SECONDS)):
            lines = self._new_lines()
        return lines

    def close(self) -> None:
        self._closed.set()
