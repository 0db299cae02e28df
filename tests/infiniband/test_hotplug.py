"""Hotplug: synthetic udev events re-run discovery; a vanished device loses only its series."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from fleetwatch.exporter.render import Renderer
from tests.infiniband.fixtures import (
    FailingFiles,
    FakeMonitor,
    FakeUdevDevice,
    add_device,
    ib_port,
    make_collector,
)


def _devices(text: str) -> set[str]:
    return {
        line.split('device="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("fleetwatch_infiniband_port_up{")
    }


def _two_devices(root: Path) -> None:
    add_device(root, "mlx5_0", ports={1: ib_port()})
    add_device(
        root, "mlx5_1", pci_path="pci0000:40/0000:40:01.0/0000:41:00.0", ports={1: ib_port()}
    )


def test_udev_events_trigger_rediscovery(tmp_path: Path) -> None:
    _two_devices(tmp_path)
    monitor = FakeMonitor()
    collector = make_collector(tmp_path, monitor=monitor)
    assert _devices(Renderer().render(collector.collect()).decode()) == {"mlx5_0", "mlx5_1"}

    (tmp_path / "class" / "infiniband" / "mlx5_1").unlink()
    shutil.rmtree(tmp_path / "devices" / "pci0000:40")
    monitor.queue.append(FakeUdevDevice("infiniband", "remove"))
    text = Renderer().render(collector.collect()).decode()
    assert _devices(text) == {"mlx5_0"}
    assert 'fleetwatch_device_events_total{action="remove",subsystem="infiniband"} 1.0' in text

    add_device(tmp_path, "mlx5_2", pci_path="pci0000:50/0000:50:01.0/0000:51:00.0",
               ports={1: ib_port()})  # fmt: skip
    monitor.queue += [FakeUdevDevice("pci", "add"), FakeUdevDevice("infiniband", "add")]
    text = Renderer().render(collector.collect()).decode()
    assert _devices(text) == {"mlx5_0", "mlx5_2"}
    assert 'fleetwatch_device_events_total{action="add",subsystem="pci"} 1.0' in text
    collector.close()


def test_without_events_nothing_is_rediscovered_until_the_timer(tmp_path: Path) -> None:
    _two_devices(tmp_path)
    now = [0.0]
    collector = make_collector(tmp_path, monitor=None, monotonic=lambda: now[0])
    collector.collect()
    add_device(tmp_path, "mlx5_2", pci_path="pci0000:50/0000:50:01.0/0000:51:00.0",
               ports={1: ib_port()})  # fmt: skip
    now[0] = 30.0
    assert _devices(Renderer().render(collector.collect()).decode()) == {"mlx5_0", "mlx5_1"}
    now[0] = 61.0
    text = Renderer().render(collector.collect()).decode()
    assert _devices(text) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    assert "fleetwatch_device_events_total" not in text
    collector.close()


def test_device_removed_mid_read_loses_only_its_series(tmp_path: Path) -> None:
    _two_devices(tmp_path)
    files = FailingFiles()
    collector = make_collector(tmp_path, files=files, monitor=FakeMonitor())
    collector.collect()
    files.on_read["mlx5_1/ports/1/counters/port_rcv_data"] = errno.ENODEV
    text = Renderer().render(collector.collect()).decode()
    assert _devices(text) == {"mlx5_0"}
    assert 'device="mlx5_1"' not in text
    assert (
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"}' in text
    )
    # The device is back (the fault cleared): the next cycle re-discovers and reads it.
    files.on_read.clear()
    assert _devices(Renderer().render(collector.collect()).decode()) == {"mlx5_0", "mlx5_1"}
    collector.close()


class CountingFiles(FailingFiles):
    """Real files (with `FailingFiles`' faults), counting the files opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    def open(self, path: str) -> int:
        self.opened += 1
        return super().open(path)


def test_the_timer_re_discovers_only_what_changed(tmp_path: Path) -> None:
    """Nothing changed: the timer's check lists folders and reads the devices' attributes,
    keeps every descriptor, and the counters go on being read; a changed attribute (new
    firmware, no udev event) is re-discovered at the next check."""
    _two_devices(tmp_path)
    now, files = [0.0], CountingFiles()
    collector = make_collector(tmp_path, files=files, monitor=None, monotonic=lambda: now[0])
    collector.collect()
    discovery = files.opened  # every counter, state and attribute file of both devices
    counters = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("7\n")
    files.opened, now[0] = 0, 61.0
    text = Renderer().render(collector.collect()).decode()
    assert 0 < files.opened <= 12 < discovery  # 2 devices x 5 attributes, 2 link layers
    assert 'error="symbol",port="1"} 7.0' in text
    fw_ver = tmp_path / "class" / "infiniband" / "mlx5_1" / "fw_ver"
    fw_ver.write_text("28.41.1000\n")
    now[0] = 90.0  # before the next check: the firmware label stays what was discovered
    assert 'firmware_version="28.41.1000"' not in Renderer().render(collector.collect()).decode()
    files.opened, now[0] = 0, 122.0
    text = Renderer().render(collector.collect()).decode()
    assert files.opened > discovery  # the check, then a whole discovery
    assert 'firmware_version="28.41.1000"' in text
    collector.close()


def test_a_counter_left_out_as_unavailable_is_asked_again_at_the_check(tmp_path: Path) -> None:
    _two_devices(tmp_path)
    now, files = [0.0], FailingFiles(on_read={"mlx5_0/ports/1/counters/port_xmit_wait": 22})
    collector = make_collector(tmp_path, files=files, monitor=None, monotonic=lambda: now[0])
    wait = 'fleetwatch_infiniband_port_xmit_wait_total{device="mlx5_0",port="1"}'
    assert wait not in Renderer().render(collector.collect()).decode()  # EINVAL: left out
    now[0] = 61.0
    assert wait not in Renderer().render(collector.collect()).decode()  # still EINVAL
    files.on_read.clear()  # the driver answers it now
    now[0] = 122.0
    assert wait in Renderer().render(collector.collect()).decode()
    collector.close()
