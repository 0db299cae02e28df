"""The real exporter on NVIDIA's mock NVML: the NVML paths end to end, through real pynvml.

NVIDIA's mock of the NVML C library (github.com/NVIDIA/k8s-test-infra, `pkg/gpu/mocknvml`)
is a `libnvidia-ml.so.1` with GPU profiles (H100, B200, GB200, GB300, A100, L40S, T4) and
live fault injection. The test suite finds it through `FLEETWATCH_NVML_MOCK`: a folder
holding `lib/libnvidia-ml.so.1` and `configs/mock-nvml-config-<profile>.yaml`.

`fleetwatch export` (no --simulate) runs in a subprocess that loads the mock through
`LD_LIBRARY_PATH`. The mock re-reads its overrides file every second, so a test injects a
fault into the running exporter by rewriting that file (`MockedExporter.override`).
The simulation stays the tool for timed scenarios and hangs; this checks real ctypes
structs, return codes and the calls the exporter makes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.sim.servers import Server, fleetwatch_command, http_get

ENVIRONMENT = "FLEETWATCH_NVML_MOCK"
LIBRARY = Path("lib") / "libnvidia-ml.so.1"
# Collectors that read no NVML: without hardware they only add noise here.
NON_NVML = (
    "--no-collector.infiniband",
    "--no-collector.podresources",
    "--no-collector.pci",
    "--no-collector.storage",
    "--no-collector.slurmjobs",
)


class MissingNvmlMock(FileNotFoundError):
    """The mock NVML is not where FLEETWATCH_NVML_MOCK says, or the variable is unset."""


@dataclass(frozen=True)
class NvmlMock:
    """A folder holding the mock library and its GPU profiles."""

    root: Path

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> NvmlMock:
        """The mock FLEETWATCH_NVML_MOCK names, or MissingNvmlMock saying what is missing
        and how to get it (CONTRIBUTING.md: "NVIDIA's mock NVML")."""
        folder = environ.get(ENVIRONMENT, "")
        if not folder:
            raise MissingNvmlMock(
                f"{ENVIRONMENT} is not set: point it at a folder holding {LIBRARY} and "
                "configs/ (CONTRIBUTING.md says how to build NVIDIA's mock NVML)"
            )
        root = Path(folder)
        if not (root / LIBRARY).is_file():
            raise MissingNvmlMock(f"{ENVIRONMENT}={folder}: {root / LIBRARY} does not exist")
        return cls(root=root)

    def profile(self, name: str) -> Path:
        """The GPU profile `name` (h100, gb200, ...), or an error listing those there are."""
        path = self.root / "configs" / f"mock-nvml-config-{name}.yaml"
        if not path.is_file():
            there = sorted(
                p.name.removeprefix("mock-nvml-config-").removesuffix(".yaml")
                for p in (self.root / "configs").glob("mock-nvml-config-*.yaml")
            )
            raise MissingNvmlMock(f"no mock NVML profile {name!r} in {path.parent}: {there}")
        return path


@dataclass
class MockedExporter:
    """A running `fleetwatch export` on the mock, and the overrides file it reads."""

    server: Server
    overrides: Path

    def override(
        self,
        *,
        every_gpu: Mapping[str, Any] | None = None,
        gpus: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the injected faults: `every_gpu` patches every GPU's profile fields,
        `gpus` one GPU's by index (e.g. `{3: {"thermal": {"temperature_gpu_c": 91}}}`).
        The mock applies it within a second; nothing given restores the profile."""
        content: dict[str, Any] = {"version": 1}
        if every_gpu:
            content["all"] = dict(every_gpu)
        if gpus:
            content["devices"] = {str(index): dict(patch) for index, patch in gpus.items()}
        staged = self.overrides.with_suffix(".new")
        staged.write_text(yaml.safe_dump(content))
        staged.replace(self.overrides)  # the mock never reads a half-written file

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of the metric `name` on /metrics now, as (labels, value)."""
        text = http_get(f"{self.server.url}/metrics").decode()
        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def by_gpu(self, name: str, **matchers: str) -> dict[str, float]:
        """`name`'s samples whose labels include `matchers`, by their `gpu` label (the
        metric must have one sample per GPU among those)."""
        out: dict[str, float] = {}
        for labels, value in self.series(name):
            if all(labels.get(k) == v for k, v in matchers.items()):
                if labels["gpu"] in out:
                    raise AssertionError(f"{name}{matchers}: two samples for GPU {labels['gpu']}")
                out[labels["gpu"]] = value
        return out


@contextlib.contextmanager
def exporter_on_mock(
    workdir: Path,
    *,
    mock: NvmlMock,
    profile: str,
    strict: bool = False,
    args: Sequence[str] = ("--collector.interval=1s",),
) -> Iterator[MockedExporter]:
    """`fleetwatch export` on the mock's `profile`, with an empty overrides file the test
    rewrites; `strict` makes the mock abort the process on any NVML call it does not
    implement (MOCK_NVML_STRICT), which names the call in the exporter's log."""
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = workdir / "nvml-overrides.yaml"
    overrides.write_text(yaml.safe_dump({"version": 1}))
    library_path = [str(mock.root / LIBRARY.parent)]
    if os.environ.get("LD_LIBRARY_PATH"):
        library_path.append(os.environ["LD_LIBRARY_PATH"])
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(library_path),
        "MOCK_NVML_CONFIG": str(mock.profile(profile)),
        "MOCK_NVML_OVERRIDES": str(overrides),
    }
    if strict:
        env["MOCK_NVML_STRICT"] = "1"
    with fleetwatch_command(
        workdir, command="export", args=[*NON_NVML, *args], ready_path="/readyz", env=env
    ) as server:
        yield MockedExporter(server=server, overrides=overrides)
