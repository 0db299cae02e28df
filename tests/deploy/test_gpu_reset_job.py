"""The GPU reset Job (helm/fleetwatch/examples/gpu-reset-job.yaml) holds no more privilege than
the chart's exporter admin container, runs on the held node whatever its taints, never
privileged, and resets only a GPU no process holds; the tainter gets rights on Jobs only with
reset Jobs on, in its own namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import fakekube
from tests.deploy.chart import CHART, NAMESPACE, install, tainter_api_calls

JOB = CHART / "examples" / "gpu-reset-job.yaml"


@pytest.fixture(scope="module")
def default_release(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The chart installed with its defaults (once: an install takes seconds)."""
    path = tmp_path_factory.mktemp("kube") / "kubeconfig.json"
    with fakekube.serve(fakekube.FakeKubeApi(), path) as served:
        return install(served)


@pytest.fixture(scope="module")
def admin(default_release: Any) -> dict[str, Any]:
    """The exporter admin container and its pod, as the chart renders them by default."""
    pod = default_release.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "exporter-admin"]
    return {"pod": pod, "container": container}


def job() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(JOB.read_text())
    return data


def test_the_reset_job_holds_no_more_than_the_admin_container(admin: dict[str, Any]) -> None:
    pod = job()["spec"]["template"]["spec"]
    (reset,) = pod["containers"]
    mine, theirs = reset["securityContext"], admin["container"]["securityContext"]
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "readOnlyRootFilesystem"):
        assert mine[key] == theirs[key], key
    assert mine["seccompProfile"] == theirs["seccompProfile"] == {"type": "RuntimeDefault"}
    assert mine["capabilities"]["drop"] == theirs["capabilities"]["drop"] == ["ALL"]
    assert set(mine["capabilities"]["add"]) <= set(theirs["capabilities"]["add"])
    assert "privileged" not in mine
    assert pod["runtimeClassName"] == admin["pod"]["runtimeClassName"]
    env = {e["name"]: e.get("value") for e in reset["env"]}
    admin_env = {e["name"]: e.get("value") for e in admin["container"]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == admin_env["NVIDIA_DRIVER_CAPABILITIES"]
    assert pod["automountServiceAccountToken"] is False


def test_the_reset_job_runs_on_the_held_node_once_and_only_on_an_idle_gpu() -> None:
    spec = job()["spec"]
    pod = spec["template"]["spec"]
    assert spec["backoffLimit"] == 0
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeName"] == "${NODE}"
    assert {"operator": "Exists"} in pod["tolerations"]
    script = pod["containers"][0]["command"][-1]
    assert script.index("--query-compute-apps=pid") < script.index("--gpu-reset -i")
    assert "exit 3" in script


def test_check_nvml_runs_the_reset_script() -> None:
    """The script the Job runs is the one the GPU machine check runs (when asked): it imports
    it from the module the tainter builds the Job with, not a copy."""
    check = (Path(__file__).parents[1] / "hardware" / "check_nvml.py").read_text()
    assert "from fleetwatch.tainter.reset_job import RESET_SCRIPT" in check
    assert '["sh", "-c", RESET_SCRIPT]' in check


def _tainter_args(release: Any) -> list[str]:
    args: list[str] = release.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _reset_job_roles(release: Any) -> list[dict[str, Any]]:
    return [r for r in release.of_kind("Role") if r["metadata"]["name"].endswith("-reset-jobs")]


def test_repair_is_off_by_default_and_the_tainter_gets_no_right_on_jobs(
    default_release: Any,
) -> None:
    args = _tainter_args(default_release)
    assert "--repair.mode=off" in args
    assert not [a for a in args if a.startswith("--repair.reset-")]
    assert _reset_job_roles(default_release) == []


@pytest.mark.parametrize("by_reboot", [True, False])
def test_reset_jobs_bring_their_rbac_in_the_release_namespace_only(
    tmp_path: Path, by_reboot: bool
) -> None:
    """Jobs: create and get (what tainter/kube.py calls), in the release's namespace, and
    only when a GPU reset is not carried out as a reboot."""
    repair = {"mode": "on", "kinds": ["gpu-reset", "reboot"], "resetByReboot": by_reboot}
    with fakekube.serve(fakekube.FakeKubeApi(), tmp_path / "kubeconfig.json") as served:
        release = install(served, {"tainter": {"repair": repair}})
    args = _tainter_args(release)
    assert "--repair.mode=on" in args
    assert "--repair.kinds=gpu-reset,reboot" in args
    roles = _reset_job_roles(release)
    if by_reboot:
        assert roles == []
        assert "--repair.reset-by-reboot=false" not in args
        return
    (role,) = roles
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]}
    ]
    assert {("jobs", v) for v in role["rules"][0]["verbs"]} == tainter_api_calls("_batch")
    exporter_image = release.one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert "--repair.reset-by-reboot=false" in args
    assert f"--repair.reset-image={exporter_image}" in args
    assert f"--repair.reset-namespace={NAMESPACE}" in args
