"""Simulator fault kinds of the fabrics: NVLink errors and links down, a degraded NVLink
fabric, InfiniBand ports down, erring or training at a lower rate.

Each kind declares its scenario keys as fields (fault_params.py) and overrides the hooks
(fault_base.py) of the readings it changes; faults.py lists it in `FAULT_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from fleetwatch.sim.checks import Checker
from fleetwatch.sim.fault_base import Fault, GpuFault
from fleetwatch.sim.fault_params import (
    DEVICE,
    NVLINK,
    PER_SECOND,
    PORT,
    SECONDS,
    Hardware,
    choice,
    number,
)

NVLINK_ERRORS: Final = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
IB_ERRORS: Final = (
    "symbol",
    "link_error_recovery",
    "link_downed",
    "rcv",
    "rcv_remote_physical",
    "rcv_switch_relay",
    "xmit_discards",
    "xmit_constraint",
    "rcv_constraint",
    "local_link_integrity",
    "excessive_buffer_overrun",
    "vl15_dropped",
    "xmit_wait",
)


@dataclass(frozen=True, kw_only=True)
class NvlinkErrors(GpuFault):
    """An NVLink error counter grows by `per_second`."""

    KIND = "nvlink_errors"

    link: int = field(metadata=NVLINK)
    error: str = field(metadata=choice("error counter", NVLINK_ERRORS))
    per_second: float = field(metadata=PER_SECOND)
    seconds: float | None = field(default=None, metadata=SECONDS)

    def nvlink_errors(self, gpu: int, link: int, error: str, t: float) -> float:
        if (gpu, link, error) != (self.gpu, self.link, self.error):
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class NvlinkDown(GpuFault):
    """The link reads inactive."""

    KIND = "nvlink_down"

    link: int = field(metadata=NVLINK)
    seconds: float | None = field(default=None, metadata=SECONDS)

    def nvlink_down(self, gpu: int, link: int, t: float) -> bool:
        return (gpu, link) == (self.gpu, self.link) and self.active(t)


@dataclass(frozen=True, kw_only=True)
class FabricDegraded(GpuFault):
    """The GPU's NVLink-fabric health mask reports degraded bandwidth (needs
    `extra.fabric_clique_id`: without it the fake NVML has no fabric and answers
    NotSupported)."""

    KIND = "fabric_degraded"

    seconds: float | None = field(default=None, metadata=SECONDS)

    def fabric_degraded(self, gpu: int, t: float) -> bool:
        return gpu == self.gpu and self.active(t)


@dataclass(frozen=True, kw_only=True)
class PortFault(Fault):
    """A fault of one InfiniBand port."""

    device: str = field(metadata=DEVICE)
    port: int = field(metadata=PORT)

    def check_references(self, check: Checker, key: str, hardware: Hardware) -> None:
        """The port exists on its HCA."""
        ports = hardware.ports[self.device]
        if self.port > ports:
            raise check.fail(f"{key}.port", f"{self.device} has {ports} port(s)")

    def on(self, device: str, port: int) -> bool:
        """This fault is of that port."""
        return self.device == device and self.port == port


@dataclass(frozen=True, kw_only=True)
class IbPortDown(PortFault):
    """The port goes DOWN/Polling (a flap when `seconds` is set; `link_downed` counts it) and
    carries no traffic."""

    KIND = "ib_port_down"

    seconds: float | None = field(default=None, metadata=SECONDS)

    def port_down(self, device: str, port: int, t: float) -> bool:
        return self.on(device, port) and self.active(t)

    def port_flaps(self, device: str, port: int) -> int:
        return 1 if self.on(device, port) else 0

    def port_down_seconds(self, device: str, port: int, t: float) -> float:
        return self.elapsed_active(t) if self.on(device, port) else 0.0


@dataclass(frozen=True, kw_only=True)
class IbErrors(PortFault):
    """A port error counter grows by `per_second`, saturating at its PMA width in sysfs."""

    KIND = "ib_errors"

    error: str = field(metadata=choice("error counter", IB_ERRORS))
    per_second: float = field(metadata=PER_SECOND)
    seconds: float | None = field(default=None, metadata=SECONDS)

    def port_errors(self, device: str, port: int, error: str, t: float) -> float:
        if not self.on(device, port) or error != self.error:
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class IbRate(PortFault):
    """The link trains at `value` Gb/s (0 leaves the HCA's `rate_gbps`)."""

    KIND = "ib_rate"

    value: float = field(metadata=number("link rate (Gb/s)", low=0, high=1600.0))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def port_rate(self, device: str, port: int, rate: float, t: float) -> float:
        return self.value if self.on(device, port) and self.active(t) and self.value else rate
