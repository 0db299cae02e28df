"""The Helm chart: linted and rendered by the real Helm library, then checked for the
things users trip on (a tainted node losing its exporter, RBAC wider than the code,
thresholds that differ from the values). That the generated parts are current is
tests/test_generate.py's check."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.exporter.settings import LEAN_PROFILE_FLAGS, ExportSettings
from fleetwatch.flags import deprecated_flags_used
from fleetwatch.report.thresholds import judged_by, shipped_config, shipped_policy
from fleetwatch.rules.config import keep_defaults, load_config
from fleetwatch.rules.contract import load_contract
from fleetwatch.rules.override import RulesConfigFile
from fleetwatch.tainter.cli import settings_from_args
from fleetwatch.tainter.payload import taint_key
from tests.deploy import fakekube
from tests.deploy.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    Release,
    chart_generator,
    default_values,
    install,
    lint,
    tainter_api_calls,
)
from tests.rules.overrides import BAD_OVERRIDES, H100, OVERRIDE, write

SCOPE_LABEL = chart_generator().SCOPE_LABEL

OVERRIDES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tainter-off": {"tainter": {"enabled": False}},
    "servicemonitor-off": {"serviceMonitor": {"enabled": False}},
    "podmonitor": {
        "serviceMonitor": {"kind": "PodMonitor"},
        "exporter": {"collectors": {"infiniband": True}},
    },
    "custom-thresholds": {
        "thresholds": {
            "gpu_temperature_celsius": 81.5,
            "xid_critical": [48, 79],
            "nvlink_errors_per_second": {"replay": 3},
            "event_window": "30m",
            "untaint_gpu_temperature_celsius": 72,
        },
        "alerts": {"GPUOverheating": {"for": "15s", "keep_firing_for": "5m"}},
    },
    "no-operator-no-nvidia-runtime": {
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "tainter": {"alertmanagerConfig": {"enabled": False}, "dryRun": False},
        "exporter": {
            "nvidia": {"runtimeClassName": ""},
            "hostMounts": [{"name": "dev", "hostPath": "/dev", "mountPath": "/dev"}],
            "gpuProfilingAdminOnly": False,
            "collectors": {"infiniband": False},
        },
    },
    "profiling-open": {"exporter": {"gpuProfilingAdminOnly": False}},
    "lean": {"exporter": {"profile": "lean"}},
    "kernel-log": {"exporter": {"kernelLog": {"enabled": True}}},
    "kernel-log-perfmon": {
        "exporter": {"kernelLog": {"enabled": True}, "admin": {"profilingCapability": "PERFMON"}},
    },
    "open-with-kernel-log": {
        "exporter": {"gpuProfilingAdminOnly": False, "kernelLog": {"enabled": True}},
    },
    "dra-off": {"exporter": {"podResources": {"dra": "off"}}},
    "storage": {
        "exporter": {
            "storage": {
                "enabled": True,
                "mounts": ["/mnt/ckpt", "/mnt/with space"],
                "probeDirs": ["/mnt/ckpt/fleetwatch"],
                "hungTimeout": "15s",
            },
        },
    },
    "storage-discovered": {"exporter": {"storage": {"enabled": True}}},
    "no-gpm-no-podresources": {
        "exporter": {
            "collectors": {"gpm": False, "mig": False},
            "podResources": {"enabled": False},
        },
    },
    # The deprecated value that held the untaint temperature still overrides it.
    "clear-celsius-old-key": {"tainter": {"clearCelsius": 70}},
    "breaker-old-key": {
        "tainter": {
            "breaker": {"maxNodes": 0, "window": "30m"},
            "quarantine": {"after": 5, "window": "2d"},
        },
    },
    "sharded-rules": {
        "prometheusRule": {
            "additionalLabels": {"release": "kps", "team": "gpu"},
            "node": {"additionalLabels": {"prometheus": "shard"}},
            "global": {"additionalLabels": {"release": "global-ruler"}},
        },
    },
    "global-rules-off": {"prometheusRule": {"global": {"enabled": False}}},
    # An operator's policy (tests/rules/overrides.py): the same mapping as an override file.
    "rules-override": OVERRIDE,
    "no-overheat-policy": {"thresholds": {"overheat_policy": []}},
    "prometheus-client": {
        "tainter": {
            "prometheusUrl": "https://prometheus.monitoring.svc:9090",
            "prometheusClient": {
                "basicAuth": {"username": "fleetwatch", "secret": "prom-basic"},
                "tls": {
                    "caSecret": "prom-ca",
                    "clientCertSecret": "prom-client",
                    "serverName": "prometheus.example",
                },
            },
        },
    },
    "own-images": {
        "exporter": {"image": {"repository": "registry.example.com/fw-exporter", "tag": "1.2"}},
        "tainter": {"image": {"repository": "registry.example.com/fw-tainter", "tag": "1.3"}},
    },
}


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("kube") / "kubeconfig.json"
    with fakekube.serve(fakekube.FakeKubeApi(), path) as served:
        yield served


@pytest.fixture(scope="module")
def releases(kubeconfig: Path) -> dict[str, Release]:
    """One install per override set, shared by the tests of this module."""
    return {name: install(kubeconfig, values) for name, values in OVERRIDES.items()}


def rules_config() -> Any:
    return load_config()


# --- lint --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_helm_lint_is_clean(name: str, tmp_path: Path) -> None:
    assert lint(tmp_path, OVERRIDES[name]) == []


def test_helm_lint_rejects_values_outside_the_schema(tmp_path: Path) -> None:
    messages = lint(tmp_path, {"thresholds": {"gpu_temperature_celsius": "hot"}})
    assert messages, "a string temperature passed the values schema"


@pytest.mark.parametrize(
    ("override", "message"),
    [(o, m) for o, m in BAD_OVERRIDES if set(o) <= {"thresholds", "alerts"}],
)
def test_helm_refuses_a_bad_override_naming_the_key(
    kubeconfig: Path, override: dict[str, Any], message: str
) -> None:
    """The values schema is generated from the rules' schema: Helm refuses what an override
    file is refused for, naming the same key (helm-sdkpy's lint drops the message, so this
    installs)."""
    key, reason = message.split(": ", maxsplit=1)
    parts = re.sub(r"\[(\d+)\]", r".\1", key).split(".")
    named = (
        f"at '/{'/'.join(parts[:-1])}': additional properties '{parts[-1]}' not allowed"
        if reason == "unknown key"
        else f"at '/{'/'.join(parts)}'"
    )
    with pytest.raises(Exception, match=re.escape(named)):
        install(kubeconfig, override)


# --- rendering ----------------------------------------------------------------------


def test_overrides_switch_components(releases: dict[str, Release]) -> None:
    assert releases["defaults"].of_kind("Deployment")
    assert not releases["tainter-off"].of_kind("Deployment")
    assert [
        r["metadata"]["labels"]["app.kubernetes.io/component"]
        for r in releases["tainter-off"].of_kind("ClusterRole")
    ] == ["exporter"]
    assert not releases["tainter-off"].of_kind("AlertmanagerConfig")
    assert len(releases["defaults"].of_kind("ServiceMonitor")) == 2
    assert not releases["servicemonitor-off"].of_kind("ServiceMonitor")
    assert len(releases["podmonitor"].of_kind("PodMonitor")) == 2
    bare = releases["no-operator-no-nvidia-runtime"]
    assert not [o for o in bare.objects if o["apiVersion"].startswith("monitoring.coreos.com")]


def test_prometheus_rule_with_default_values_equals_the_rule_files(
    releases: dict[str, Release],
) -> None:
    files = {
        "node": ("fleetwatch.rules.yaml", "fleetwatch.recording.yaml"),
        "global": ("fleetwatch.global.yaml",),
    }
    for scope, names in files.items():
        expected = []
        for name in names:
            expected += yaml.safe_load((ROOT / "rules" / name).read_text())["groups"]
        assert _rule_of_scope(releases["defaults"], scope)["spec"]["groups"] == expected


def _rule_of_scope(release: Release, scope: str) -> dict[str, Any]:
    (rule,) = [
        r
        for r in release.of_kind("PrometheusRule")
        if r["metadata"]["labels"].get(SCOPE_LABEL) == scope
    ]
    return rule


def test_one_prometheus_rule_per_scope_with_the_same_labels_by_default(
    releases: dict[str, Release],
) -> None:
    rules = releases["defaults"].of_kind("PrometheusRule")
    assert sorted(r["metadata"]["name"] for r in rules) == [
        f"{RELEASE}-fleetwatch-global",
        f"{RELEASE}-fleetwatch-node",
    ]
    labels = [{k: v for k, v in r["metadata"]["labels"].items() if k != SCOPE_LABEL} for r in rules]
    assert labels[0] == labels[1]
    assert not releases["no-operator-no-nvidia-runtime"].of_kind("PrometheusRule")


def test_each_scope_gets_the_labels_its_ruler_selects(releases: dict[str, Release]) -> None:
    node = _rule_of_scope(releases["sharded-rules"], "node")["metadata"]["labels"]
    global_ = _rule_of_scope(releases["sharded-rules"], "global")["metadata"]["labels"]
    assert (node["release"], node["team"], node["prometheus"]) == ("kps", "gpu", "shard")
    assert (global_["release"], global_["team"]) == ("global-ruler", "gpu")
    assert "prometheus" not in global_
    names = {
        g["name"] for g in _rule_of_scope(releases["sharded-rules"], "global")["spec"]["groups"]
    }
    assert "fleetwatch-training-jobs" in names
    (only,) = releases["global-rules-off"].of_kind("PrometheusRule")
    assert only["metadata"]["labels"][SCOPE_LABEL] == "node"


def test_prometheus_rule_thresholds_equal_the_values(releases: dict[str, Release]) -> None:
    overrides = OVERRIDES["custom-thresholds"]
    parameters = {
        "thresholds.gpu_temperature_celsius": "81.5",
        "thresholds.xid_critical": "48|79",
        "thresholds.nvlink_errors_per_second.replay": "3",
        "thresholds.event_window": "30m",
        "alerts.GPUOverheating.for": overrides["alerts"]["GPUOverheating"]["for"],
        "alerts.GPUOverheating.keep_firing_for": "5m",
    }
    groups = []
    for scope in ("node", "global"):
        expected = chart_generator().rule_groups(rules_config(), parameters.get, scope)
        rule = _rule_of_scope(releases["custom-thresholds"], scope)
        assert rule["spec"]["groups"] == expected
        groups += rule["spec"]["groups"]
    overheating = next(r for g in groups for r in g["rules"] if r.get("alert") == "GPUOverheating")
    # The default (absolute) policy's threshold; models with a policy of their own follow it.
    assert "\n(81.5 - " in overheating["expr"]
    assert overheating["for"] == "15s"
    assert "{{ $labels.node }}" in overheating["annotations"]["summary"]


@pytest.mark.parametrize("name", ["rules-override", "no-overheat-policy", "defaults"])
def test_chart_values_make_the_rules_an_override_file_makes(
    releases: dict[str, Release], name: str, tmp_path: Path
) -> None:
    """The chart's values and an override file are one policy: the PrometheusRules rendered
    from the values equal the rules written from the same mapping as an override file, the
    per-model overheat policy (looped over by Helm) included."""
    config = load_config(override=write(tmp_path / "override.yaml", OVERRIDES[name]))
    for scope in ("node", "global"):
        expected = chart_generator().rule_groups(config, keep_defaults, scope)
        assert _rule_of_scope(releases[name], scope)["spec"]["groups"] == expected


def test_chart_values_move_the_rules_the_tainter_and_the_report(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    release = releases["rules-override"]
    groups = [
        g for scope in ("node", "global") for g in _rule_of_scope(release, scope)["spec"]["groups"]
    ]
    hot = next(r for g in groups for r in g["rules"] if r.get("alert") == "GPUOverheating")
    assert hot["for"] == "30s"
    assert "(83 - fleetwatch_gpu_temperature_celsius" in hot["expr"]
    assert f'name="{H100}"' in hot["expr"]
    assert "GB200" not in hot["expr"]
    # The tainter: its clear conditions, from the values through its override ConfigMap.
    tainter = _tainter_settings(release, tmp_path)
    clear = tainter.evidence_queries["gpu-overheat"]
    assert "> 83 - 79\n" in clear
    assert "(80 - max_over_time(fleetwatch_gpu_temperature_celsius" in clear
    assert "[5m]" in clear
    rules = RulesConfigFile(config_file=write(tmp_path / "override.yaml"))
    assert tainter.evidence_queries == dict(rules.contract(rules.load()).clear)
    # The report, given the ConfigMap's file: the same thresholds and overheat policy.
    with judged_by(_rules_override(release, tmp_path)):
        assert shipped_policy().temperature_celsius == 83
        assert shipped_policy().job_busy_ratio == 0.6
        assert shipped_config().overheat_limit(H100).celsius == 80


def _tolerates(tolerations: list[dict[str, Any]], key: str, effect: str) -> bool:
    """Kubernetes' matching of one taint (with a value) against a pod's tolerations."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", effect):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", key):
            return True
    return False


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_exporter_tolerates_every_taint_the_tainter_writes(
    releases: dict[str, Release], effect: str
) -> None:
    reasons = {p.taint for p in rules_config().alerts.values() if p.taint}
    assert reasons, "rules/config.yaml has no tainting alert"
    for release in releases.values():
        pod = release.one("DaemonSet")["spec"]["template"]["spec"]
        for reason in reasons:
            assert _tolerates(pod["tolerations"], taint_key(reason), effect), reason
        assert not _tolerates(pod["tolerations"], "example.com/other", effect)


# The calls of features the chart grants rights for only when they are on.
EVICTION_CALLS = frozenset({("pods", "list"), ("pods/eviction", "create")})
CONDITION_CALLS = frozenset({("nodes/status", "patch")})


def _grants(role: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_exactly_what_the_tainter_calls(releases: dict[str, Release]) -> None:
    release = releases["defaults"]
    calls = tainter_api_calls()
    assert {("nodes", "patch")} | EVICTION_CALLS | CONDITION_CALLS <= calls
    roles = {r["metadata"]["name"].rsplit("-", 1)[-1]: r for r in release.of_kind("Role")}
    cluster = _grants(release.one("ClusterRole", "tainter"))
    namespaced = _grants(roles["events"])
    # eviction is off by default: no right on pods at all
    assert cluster | namespaced == calls - EVICTION_CALLS
    assert all(resource.startswith("nodes") for resource, _ in cluster)
    assert (
        roles["events"]["metadata"]["namespace"] == default_values()["tainter"]["eventsNamespace"]
    )
    for role in (release.one("ClusterRole", "tainter"), roles["events"]):
        assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    # the Lease: exactly the verbs the leader election and breaker code calls, in the
    # release namespace, and all but create limited to the one Lease the tainter uses
    lease_role = roles["lease"]
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert _grants(lease_role) == tainter_api_calls("_coordination")
    assert all(rule["apiGroups"] == ["coordination.k8s.io"] for rule in lease_role["rules"])
    deployment = release.one("Deployment")
    args = _container(deployment)["args"]
    lease_name = next(a for a in args if a.startswith("--leader-elect.name=")).split("=", 1)[1]
    for rule in lease_role["rules"]:
        assert rule.get("resourceNames") == (None if rule["verbs"] == ["create"] else [lease_name])
    account = release.one("ServiceAccount", "tainter")["metadata"]["name"]
    for binding in (release.one("ClusterRoleBinding", "tainter"), *release.of_kind("RoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]


def test_exporter_rbac_reads_resourceslices_and_nothing_more(
    releases: dict[str, Release],
) -> None:
    release = releases["defaults"]
    role = release.one("ClusterRole", "exporter")
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    account = release.one("ServiceAccount", "exporter")["metadata"]["name"]
    binding = release.one("ClusterRoleBinding", "exporter")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    pod = release.one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    assert pod["automountServiceAccountToken"] is True
    containers = _exporter_containers(release)
    # the collector runs in the admin container; it learns its node from the downward API
    assert "--collector.podresources.dra=auto" in containers["exporter-admin"]["args"]
    assert not any("podresources.dra" in a for a in containers["exporter"]["args"])
    env = {e["name"]: e for e in containers["exporter-admin"]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("name", ["dra-off", "no-gpm-no-podresources"])
def test_no_dra_means_no_token_and_no_exporter_rbac(
    releases: dict[str, Release], name: str
) -> None:
    release = releases[name]
    assert not [
        o
        for o in release.objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "exporter"
        and o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    pod = release.one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod


@pytest.mark.parametrize(
    ("values", "granted"),
    [
        ({"evict": {"reasons": ["gpu-overheat"]}}, EVICTION_CALLS | CONDITION_CALLS),
        ({"nodeCondition": {"type": ""}}, frozenset()),
    ],
    ids=["evict-on", "condition-off"],
)
def test_feature_rbac_comes_with_the_feature(
    kubeconfig: Path, values: dict[str, Any], granted: frozenset[tuple[str, str]]
) -> None:
    release = install(kubeconfig, {"tainter": values})
    cluster = _grants(release.one("ClusterRole", "tainter"))
    assert cluster - {("nodes", v) for v in ("get", "list", "patch")} == granted | (
        {("events", "create")} if granted >= EVICTION_CALLS else set()
    )
    args = _container(release.one("Deployment"))["args"]
    assert ("--evict.reasons=gpu-overheat" in args) == (granted >= EVICTION_CALLS)
    assert f"--node-condition.type={'GPUHealthy' if granted >= CONDITION_CALLS else ''}" in args


def _container(obj: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The workload's only container, or the one called `name`."""
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def _exporter_containers(release: Release) -> dict[str, dict[str, Any]]:
    """The exporter DaemonSet's containers by name."""
    pod = release.one("DaemonSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _parse(args: list[str], token_file: Path, rules_file: Path | None = None) -> Any:
    """Parse container args with the real `fleetwatch` CLI (unknown flags exit), the files
    they name (the webhook token, the rules override) read from where the test put them."""
    args = [re.sub(r"^--web.token-file=.*", f"--web.token-file={token_file}", a) for a in args]
    args = [re.sub(r"=/etc/fleetwatch/prometheus/.*", f"={token_file}", a) for a in args]
    if rules_file is not None:
        args = [
            re.sub(r"^--rules.config-file=.*", f"--rules.config-file={rules_file}", a) for a in args
        ]
    return build_parser().parse_args(args)


def _rules_override(release: Release, tmp_path: Path) -> Path:
    """The tainter's rules override, as its ConfigMap mounts it, written under `tmp_path`."""
    (configmap,) = [
        o for o in release.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-rules")
    ]
    path = tmp_path / "rules.config.yaml"
    path.write_text(configmap["data"]["rules.config.yaml"])
    return path


def _tainter_settings(release: Release, tmp_path: Path) -> Any:
    """The tainter's settings, from its container args and its rules override ConfigMap."""
    token = tmp_path / "token"
    token.write_text("secret\n")
    args = _container(release.one("Deployment"))["args"]
    parsed = _parse(args, token, _rules_override(release, tmp_path))
    assert parsed.command == "taint"
    assert deprecated_flags_used(parsed) == {}
    return settings_from_args(parsed)


@pytest.mark.parametrize(
    # The Prometheus client's files are Secrets a test has no certificates for: its args are
    # parsed in test_the_tainter_authenticates_to_prometheus_from_secrets.
    "name",
    [name for name in OVERRIDES if name != "prometheus-client"],
)
def test_container_args_parse_with_the_real_cli(
    releases: dict[str, Release], name: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    release = releases[name]
    for container in _exporter_containers(release).values():
        exporter = _parse(container["args"], token)
        assert exporter.command == "export"
        assert exporter.collector_interval == 5.0
        assert deprecated_flags_used(exporter) == {}
    if release.of_kind("Deployment"):
        tainter = _tainter_settings(release, tmp_path)
        assert tainter.controller.dry_run is (name != "no-operator-no-nvidia-runtime")
        assert tainter.election.enabled
        assert tainter.election.namespace == NAMESPACE
        policy = tainter.policy
        assert policy.declared_reasons == frozenset(default_values()["taintReasons"])
        assert (policy.allow_noexecute, policy.max_per_node) == (frozenset(), 8)
        # The untaint evidence is the rules' remediation contract, its thresholds those of
        # the values (the tainter reads them as its rules override, from a ConfigMap).
        contract = load_contract()
        expected = dict(contract.clear)
        # gpu-overheat clears at a margin below the threshold: `(T - temperature) > T - U`.
        threshold, untaint = {
            "custom-thresholds": ("81.5", "72"),
            "clear-celsius-old-key": (
                "78",
                "70",
            ),
        }.get(name, ("78", "75"))
        expected["gpu-overheat"] = (
            expected["gpu-overheat"]
            .replace("((78 - ", f"(({threshold} - ")
            .replace("> 78 - 75\n", f"> {threshold} - {untaint}\n")
        )
        if name in ("rules-override", "no-overheat-policy"):
            # A policy of the operator's: what the same mapping as an override file gives.
            rules = RulesConfigFile(config_file=write(tmp_path / "same.yaml", OVERRIDES[name]))
            expected = dict(rules.contract(rules.load()).clear)
        assert tainter.evidence_queries == expected
        assert set(tainter.controller.manual_reasons) == set(contract.manual)
        # The breaker's caps and the quarantine; the old maxNodes key still works, 0 too.
        breaker, quarantine = tainter.breaker, tainter.controller.quarantine
        if name == "breaker-old-key":
            assert (breaker.max_new_taints, breaker.window) == (0, 1800.0)
            assert (quarantine.after, quarantine.window) == (5, 172800.0)
        else:
            assert (breaker.max_new_taints, breaker.window, breaker.max_fraction) == (
                10,
                3600.0,
                0.1,
            )
            assert (quarantine.after, quarantine.window) == (3, 86400.0)


def test_dry_run_is_on_by_default_and_says_so(releases: dict[str, Release]) -> None:
    assert "--dry-run" in _container(releases["defaults"].one("Deployment"))["args"]
    assert "DRY-RUN is ON" in releases["defaults"].notes
    live = releases["no-operator-no-nvidia-runtime"]
    assert "--dry-run" not in _container(live.one("Deployment"))["args"]
    assert "Tainting is LIVE" in live.notes


def test_exporter_pod_reads_the_host_safely(releases: dict[str, Release]) -> None:
    daemonset = releases["defaults"].one("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    main, admin = _container(daemonset, "exporter"), _container(daemonset, "exporter-admin")
    volumes = {v["name"]: v for v in pod["volumes"]}
    main_mounts = {m["name"]: m for m in main["volumeMounts"]}
    admin_mounts = {m["name"]: m for m in admin["volumeMounts"]}
    assert main_mounts["sysfs"]["readOnly"] is True
    assert volumes["sysfs"]["hostPath"]["path"] == "/sys"
    assert "--path.sysfs=/host/sys" in main["args"]
    # The kubelet socket only where its reader runs (as root); no kernel log by default.
    assert "pod-resources" not in main_mounts
    assert admin_mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert admin_mounts["pod-resources"]["readOnly"] is True
    assert "kmsg" not in volumes
    kernel_log = releases["kernel-log"].one("DaemonSet")
    assert {v["name"]: v for v in kernel_log["spec"]["template"]["spec"]["volumes"]}["kmsg"][
        "hostPath"
    ] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in _container(
        kernel_log, "exporter-admin"
    )["volumeMounts"]
    assert "kmsg" not in {m["name"] for m in _container(kernel_log, "exporter")["volumeMounts"]}
    for container in (main, admin):
        env = {e["name"]: e for e in container["env"]}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        port = container["ports"][0]["name"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        assert set(container["resources"]) == {"requests", "limits"}
    assert pod["runtimeClassName"] == "nvidia"
    # the token is there only for DRA attribution (test_exporter_rbac_reads_resourceslices...)
    assert pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] == "system-node-critical"

    bare = releases["no-operator-no-nvidia-runtime"].one("DaemonSet")
    assert "runtimeClassName" not in bare["spec"]["template"]["spec"]
    bare_container = _container(bare)
    assert bare_container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--no-collector.infiniband" in bare_container["args"]
    assert {"name": "dev", "mountPath": "/dev", "readOnly": True} in bare_container["volumeMounts"]


# Capabilities a documented source needs (docs/deploy.md, "Privileges on the node").
_DOCUMENTED_ADDS = {"SYS_ADMIN", "PERFMON", "SYSLOG"}


def api_server_rejects(security: Mapping[str, Any]) -> str | None:
    """Why the Kubernetes API server would refuse this container securityContext, or None.

    Its validation (ValidateSecurityContext) refuses `allowPrivilegeEscalation: false`
    together with `privileged` or with `CAP_SYS_ADMIN` added. It compares the spelling
    `CAP_SYS_ADMIN` only; the short `SYS_ADMIN`, which the runtime grants all the same,
    is refused here too: the pair is a contradiction in either spelling. The stand-in API
    server of these tests does not validate pods, so this check stands in for it.
    """
    if security.get("allowPrivilegeEscalation") is not False:
        return None
    if security.get("privileged"):
        return "allowPrivilegeEscalation: false with privileged"
    added = security.get("capabilities", {}).get("add", [])
    if {"SYS_ADMIN", "CAP_SYS_ADMIN"} & set(added):
        return "allowPrivilegeEscalation: false with CAP_SYS_ADMIN"
    return None


def test_api_server_check_refuses_the_pair() -> None:
    pair = {"allowPrivilegeEscalation": False, "capabilities": {"add": ["CAP_SYS_ADMIN"]}}
    assert api_server_rejects(pair) == "allowPrivilegeEscalation: false with CAP_SYS_ADMIN"
    assert api_server_rejects({**pair, "capabilities": {"add": ["SYSLOG"]}}) is None
    assert api_server_rejects({"capabilities": {"add": ["SYS_ADMIN"]}}) is None


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_every_exporter_container_holds_least_privilege(
    releases: dict[str, Release], name: str
) -> None:
    pod = releases[name].one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "runAsUser" not in pod["securityContext"]
    for container in pod["containers"]:
        security = container["securityContext"]
        where = container["name"]
        assert api_server_rejects(security) is None, where
        assert "privileged" not in security, where
        assert security["readOnlyRootFilesystem"] is True, where
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert security["capabilities"]["drop"] == ["ALL"], where
        added = set(security["capabilities"].get("add", []))
        assert added <= _DOCUMENTED_ADDS, where
        assert (security.get("allowPrivilegeEscalation") is False) == ("SYS_ADMIN" not in added)
        if where == "exporter":
            assert added == set(), "the main container holds no capability"
            assert security["runAsNonRoot"] is True
            assert security["runAsUser"] == 65532
        else:
            assert where == "exporter-admin"
            assert security["runAsUser"] == 0


def _collectors_by_container(release: Release, token: Path) -> dict[str, set[str]]:
    """The collectors each exporter container runs, parsed with the real CLI."""
    names = [spec.name for spec in COLLECTORS]
    return {
        container["name"]: {
            n for n in names if getattr(_parse(container["args"], token), f"collector_{n}")
        }
        for container in _exporter_containers(release).values()
    }


@pytest.mark.parametrize(
    ("name", "admin", "adds", "xid_sources"),
    [
        ("defaults", {"gpm", "mig", "podresources"}, ["SYS_ADMIN"], {"exporter": {"nvml"}}),
        (
            "kernel-log",
            {"gpm", "mig", "podresources", "xid"},
            ["SYS_ADMIN", "SYSLOG"],
            {"exporter-admin": {"nvml", "kmsg"}},
        ),
        (
            "kernel-log-perfmon",
            {"gpm", "mig", "podresources", "xid"},
            ["PERFMON", "SYSLOG"],
            {"exporter-admin": {"nvml", "kmsg"}},
        ),
        ("no-gpm-no-podresources", None, None, {"exporter": {"nvml"}}),
        ("profiling-open", None, None, {"exporter": {"nvml"}}),
        ("open-with-kernel-log", None, None, {"exporter": {"nvml"}}),
    ],
)
def test_each_collector_runs_once_in_the_container_holding_what_it_needs(
    releases: dict[str, Release],
    tmp_path: Path,
    name: str,
    admin: set[str] | None,
    adds: list[str] | None,
    xid_sources: dict[str, set[str]],
) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    release = releases[name]
    running = _collectors_by_container(release, token)
    containers = _exporter_containers(release)
    # Slurm's job mapping never runs on Kubernetes (a node there has pods, not Slurm jobs).
    everything = {spec.name for spec in COLLECTORS} - {"slurmjobs"}
    switched_off = {
        n for n, on in OVERRIDES[name].get("exporter", {}).get("collectors", {}).items() if not on
    }
    if admin is None:
        assert set(running) == {"exporter"}, "no admin container without a privileged source"
        # Non-root everywhere: the PodResources socket (root only) is not read.
        assert running["exporter"] == everything - switched_off - {"podresources"}
    else:
        assert running["exporter-admin"] == admin
        assert running["exporter"] == everything - admin
        security = containers["exporter-admin"]["securityContext"]
        assert security["capabilities"]["add"] == adds
    for container, sources in xid_sources.items():
        parsed = _parse(containers[container]["args"], token)
        assert parsed.collector_xid_source == sources


def test_chart_collector_names_are_the_exporters() -> None:
    names = [spec.name for spec in COLLECTORS]
    template = (CHART / "templates" / "_exporter.tpl").read_text()
    listed = re.search(r'range \$name := list ((?:"\w+" ?)+)', template)
    assert listed, "_exporter.tpl no longer lists the collectors"
    assert re.findall(r'"(\w+)"', listed.group(1)) == names
    schema = json.loads((CHART / "values.schema.json").read_text())
    collectors = schema["properties"]["exporter"]["properties"]["collectors"]
    assert collectors["propertyNames"]["enum"] == names


_STORAGE_VOLUMES = {"host-proc", "host-root"}


def _export_settings(container: Mapping[str, Any], tmp_path: Path) -> ExportSettings:
    """What `fleetwatch export` runs with, from the container's args."""
    token = tmp_path / "token"
    token.write_text("secret\n")
    return ExportSettings.from_args(_parse(container["args"], token), COLLECTORS)


def test_storage_mounts_the_nodes_proc_and_root_and_only_probe_dirs_read_write(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    daemonset = releases["storage"].one("DaemonSet")
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert volumes["host-root"]["hostPath"] == {"path": "/", "type": "Directory"}
    # A probe directory is never created: kubelet checks it exists.
    assert volumes["storage-probe-0"]["hostPath"] == {
        "path": "/mnt/ckpt/fleetwatch",
        "type": "Directory",
    }
    main = _container(daemonset, "exporter")
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert mounts["host-root"] == {
        "name": "host-root",
        "mountPath": "/host/root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert mounts["storage-probe-0"] == {
        "name": "storage-probe-0",
        "mountPath": "/host/root/mnt/ckpt/fleetwatch",
        "mountPropagation": "HostToContainer",
    }
    # Read-write host paths: the probe directories and nothing else.
    host_paths = {name for name, volume in volumes.items() if "hostPath" in volume}
    writable = {m["name"] for m in main["volumeMounts"] if not m.get("readOnly")}
    assert writable & host_paths == {"storage-probe-0"}
    # No propagation the container could push to the host, no privilege for it.
    assert {m.get("mountPropagation", "None") for m in main["volumeMounts"]} <= {
        "None",
        "HostToContainer",
    }
    settings = _export_settings(main, tmp_path)
    assert (settings.procfs_root, settings.rootfs_root) == (Path("/host/proc"), Path("/host/root"))
    storage = settings.collectors["storage"]
    assert storage.mounts == ("/mnt/ckpt", "/mnt/with space")
    assert storage.probe_dir == ("/mnt/ckpt/fleetwatch",)
    assert storage.hung_timeout == 15.0
    # The admin container (gpm, podresources) sees none of it.
    admin = _container(daemonset, "exporter-admin")
    assert not _STORAGE_VOLUMES & {m["name"] for m in admin["volumeMounts"]}
    assert not [a for a in admin["args"] if a.startswith(("--path.procfs", "--path.rootfs"))]


def test_storage_without_named_mounts_discovers_and_probes_nothing(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    daemonset = releases["storage-discovered"].one("DaemonSet")
    volumes = {v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes >= _STORAGE_VOLUMES
    assert not [v for v in volumes if v.startswith("storage-probe")]
    settings = _export_settings(_container(daemonset, "exporter"), tmp_path)
    assert settings.rootfs_root == Path("/host/root")
    assert (settings.collectors["storage"].mounts, settings.collectors["storage"].probe_dir) == (
        (),
        (),
    )
    assert settings.collectors["storage"].hung_timeout == 10.0


@pytest.mark.parametrize("name", ["defaults", "profiling-open", "no-operator-no-nvidia-runtime"])
def test_storage_off_mounts_nothing_of_the_host(releases: dict[str, Release], name: str) -> None:
    pod = releases[name].one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert not (_STORAGE_VOLUMES | {"storage-probe-0"}) & volumes
    for container in pod["containers"]:
        assert not [
            a for a in container["args"] if a.startswith(("--path.procfs", "--path.rootfs"))
        ]
        assert "mountPropagation" not in json.dumps(container["volumeMounts"])


@pytest.mark.parametrize(
    "storage",
    [
        {"probeDirs": ["relative/fleetwatch"]},
        {"mounts": ["/mnt/../etc"]},
        {"mounts": ["/mnt/ckpt/"]},
        {"probeDirs": ["/"]},
        {"mounts": ["/mnt/ckpt", "/mnt/ckpt"]},
        {"hungTimeout": "soon"},
        {"privileged": True},
    ],
)
def test_helm_lint_rejects_bad_storage_values(tmp_path: Path, storage: dict[str, Any]) -> None:
    assert lint(tmp_path, {"exporter": {"storage": {"enabled": True, **storage}}}) != []


def test_helm_lint_rejects_an_unknown_profile(tmp_path: Path) -> None:
    assert lint(tmp_path, {"exporter": {"profile": "tiny"}}) != []


def test_helm_lint_rejects_an_events_namespace_other_than_default(tmp_path: Path) -> None:
    """A real API server refuses Events about a node outside `default`: the schema pins it."""
    assert lint(tmp_path, {"tainter": {"eventsNamespace": "monitoring"}}) != []


def test_helm_lint_rejects_an_unknown_collector(tmp_path: Path) -> None:
    assert lint(tmp_path, {"exporter": {"collectors": {"gpu-typo": False}}})


@pytest.mark.parametrize("name", ["defaults", "podmonitor", "profiling-open"])
def test_every_exporter_container_is_scraped_and_only_by_prometheus(
    releases: dict[str, Release], name: str
) -> None:
    release = releases[name]
    ports = {
        p["name"]: p["containerPort"]
        for c in _exporter_containers(release).values()
        for p in c["ports"]
    }
    assert len(ports) == len(_exporter_containers(release))
    expected = (
        {"metrics": 9842}
        if name == "profiling-open"
        else {
            "metrics": 9842,
            "metrics-admin": 9843,
        }
    )
    assert ports == expected
    service = release.one("Service", "exporter")["spec"]["ports"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service} == {
        n: (port, n) for n, port in ports.items()
    }
    kind = "PodMonitor" if name == "podmonitor" else "ServiceMonitor"
    monitor = release.one(kind, "exporter")["spec"]
    endpoints = monitor["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    assert sorted(e["port"] for e in endpoints) == sorted(ports)
    policy = release.one("NetworkPolicy", "exporter")["spec"]
    assert policy["podSelector"] == release.one("DaemonSet")["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [default_values()["exporter"]["networkPolicy"]["prometheusSelector"]]
    assert sorted(p["port"] for p in rule["ports"]) == sorted(ports)
    assert {p["protocol"] for p in rule["ports"]} == {"TCP"}


def test_each_workload_runs_its_own_image(releases: dict[str, Release]) -> None:
    values = default_values()
    defaults, own = releases["defaults"], releases["own-images"]
    release_version = version("fleetwatch")
    for release, exporter_image, tainter_image in (
        (defaults, f"{values['exporter']['image']['repository']}:{release_version}",
         f"{values['tainter']['image']['repository']}:{release_version}"),
        (own, "registry.example.com/fw-exporter:1.2", "registry.example.com/fw-tainter:1.3"),
    ):  # fmt: skip
        assert {c["image"] for c in _exporter_containers(release).values()} == {exporter_image}
        assert _container(release.one("Deployment"))["image"] == tainter_image
    assert values["exporter"]["image"]["repository"] != values["tainter"]["image"]["repository"]


def test_tainter_runs_unprivileged_with_its_token(releases: dict[str, Release]) -> None:
    release = releases["defaults"]
    deployment = release.one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    secret = release.one("Secret")
    token_volume = next(v for v in pod["volumes"] if "secret" in v)
    assert token_volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert len(secret["data"]["token"]) >= 48


def test_monitors_label_job_and_node_as_the_rules_expect(releases: dict[str, Release]) -> None:
    config = rules_config()
    scrape_jobs = config.scrape_jobs()
    jobs = {component: scrape_jobs[component] for component in ("exporter", "tainter")}
    for kind, release in (("ServiceMonitor", "defaults"), ("PodMonitor", "podmonitor")):
        endpoints_key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        for component, job in jobs.items():
            monitor = releases[release].one(kind, component)
            endpoints = monitor["spec"][endpoints_key]
            assert len(endpoints) == (2 if component == "exporter" else 1)
            for endpoint in endpoints:
                assert endpoint["interval"] == config.scrape_interval
                relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
                assert relabel["job"]["replacement"] == job
                assert relabel["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
                assert endpoint["honorLabels"] is True


def test_dashboards_are_configmaps_for_the_grafana_sidecar(
    releases: dict[str, Release],
) -> None:
    maps = [
        cm
        for cm in releases["defaults"].of_kind("ConfigMap")
        if "grafana_dashboard" in cm["metadata"]["labels"]
    ]
    sources = sorted((CHART / "dashboards").glob("*.json"))
    assert len(maps) == len(sources)
    by_key = {key: (cm, text) for cm in maps for key, text in cm["data"].items()}
    for source in sources:
        configmap, text = by_key[source.name]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(text) == json.loads(source.read_text())


def test_alertmanager_config_is_the_plain_route(releases: dict[str, Release]) -> None:
    plain = yaml.safe_load((ROOT / "rules" / "alertmanager.yml").read_text())
    (route,) = [r for r in plain["route"]["routes"] if r["receiver"] == "fleetwatch-tainter"]
    (receiver,) = [r for r in plain["receivers"] if r["name"] == "fleetwatch-tainter"]
    release = releases["defaults"]
    spec = release.one("AlertmanagerConfig")["spec"]
    assert spec["route"]["groupBy"] == route["group_by"]
    assert spec["route"]["groupWait"] == route["group_wait"]
    assert spec["route"]["groupInterval"] == route["group_interval"]
    assert spec["route"]["repeatInterval"] == route["repeat_interval"]
    assert spec["route"]["continue"] is route["continue"]
    assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in spec["route"]["matchers"]] == (
        route["matchers"]
    )
    (webhook,) = spec["receivers"][0]["webhookConfigs"]
    assert webhook["sendResolved"] is receiver["webhook_configs"][0]["send_resolved"] is True
    assert webhook["url"].endswith(f":{default_values()['tainter']['port']}/alerts")
    assert webhook["httpConfig"]["authorization"]["type"] == "Bearer"
    assert (
        webhook["httpConfig"]["authorization"]["credentials"]["name"]
        == (release.one("Secret")["metadata"]["name"])
    )


def test_network_policy_admits_only_alertmanager_prometheus_and_the_replicas(
    releases: dict[str, Release],
) -> None:
    release = releases["defaults"]
    policy = release.one("NetworkPolicy", "tainter")["spec"]
    (rule,) = policy["ingress"]
    *others, replicas = rule["from"]
    names = [peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in others]
    assert names == ["alertmanager", "prometheus"]
    # a standby hands the leader the webhooks it receives: the tainter's own pods, only
    assert replicas == {
        "podSelector": {"matchLabels": release.one("Deployment")["spec"]["selector"]["matchLabels"]}
    }
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert policy["policyTypes"] == ["Ingress"]


@pytest.mark.integration  # Helm installs against an API server
def test_webhook_token_is_kept_on_upgrade_or_taken_from_an_existing_secret(
    tmp_path: Path,
) -> None:
    api = fakekube.FakeKubeApi()
    kept = base64.b64encode(b"token-from-the-first-install").decode()
    name = "fw-fleetwatch-tainter-token"
    api.seed(
        f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {  # what the first install left: Helm's ownership marks
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": RELEASE,
                    "meta.helm.sh/release-namespace": NAMESPACE,
                },
            },
            "data": {"token": kept},
        },
    )
    with fakekube.serve(api, tmp_path / "kubeconfig.json") as kubeconfig:
        upgraded = install(kubeconfig)
        own = install(kubeconfig, {"tainter": {"webhookToken": {"existingSecret": "mine"}}})
    assert upgraded.one("Secret")["data"]["token"] == kept
    assert not own.of_kind("Secret")
    pod = own.one("Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["secretName"] == "mine"
    routed = own.one("AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"][0]
    assert routed["httpConfig"]["authorization"]["credentials"]["name"] == "mine"


def test_tainter_runs_highly_available(releases: dict[str, Release]) -> None:
    release = releases["defaults"]
    deployment = release.one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 2
    (spread,) = pod["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname",
        "DoNotSchedule",
    )
    assert spread["labelSelector"]["matchLabels"] == selector
    container = _container(deployment)
    # a standby must count as ready, or the budget below could never let the leader go
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    budget = release.one("PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    # the leader publishes its pod IP on the Lease; a standby hands it the webhooks
    port = default_values()["tainter"]["port"]
    assert f"--leader-elect.advertise-url=http://$(POD_IP):{port}" in container["args"]
    assert "--leader-elect.forward-timeout=5s" in container["args"]
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert not releases["tainter-off"].of_kind("PodDisruptionBudget")


def test_admission_policy_limits_the_tainter_to_its_own_taints(
    releases: dict[str, Release],
) -> None:
    release = releases["defaults"]
    policy = release.one("ValidatingAdmissionPolicy")
    binding = release.one("ValidatingAdmissionPolicyBinding")
    account = release.one("ServiceAccount", "tainter")["metadata"]["name"]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    # nodes/status too, where only the GPUHealthy condition may change
    assert (rule["resources"], rule["operations"]) == (["nodes", "nodes/status"], ["UPDATE"])
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{account}"'
    )
    checks = " ".join(v["expression"] for v in spec["validations"])
    for subject in ("Taints", "Labels", "Annotations", "unschedulable", "Conditions"):
        assert subject in checks
    assert checks.count("startsWith('fleetwatch.io/')") == 6
    assert not releases["tainter-off"].of_kind("ValidatingAdmissionPolicy")


def test_admission_policy_follows_the_features(kubeconfig: Path) -> None:
    """Without the condition the policy sees nodes only; with eviction a second policy
    sees the tainter's Evictions (tests/tainter/test_admission_real.py evaluates both)."""
    release = install(
        kubeconfig,
        {"tainter": {"nodeCondition": {"type": ""}, "evict": {"reasons": ["gpu-overheat"]}}},
    )
    policies = {
        p["metadata"]["name"].rsplit("-", 1)[-1]: p
        for p in release.of_kind("ValidatingAdmissionPolicy")
    }
    assert sorted(policies) == ["evictions", "nodes"]
    (nodes,) = policies["nodes"]["spec"]["matchConstraints"]["resourceRules"]
    assert nodes["resources"] == ["nodes"]
    assert "conditions" not in json.dumps(policies["nodes"]["spec"])
    (evictions,) = policies["evictions"]["spec"]["matchConstraints"]["resourceRules"]
    assert (evictions["resources"], evictions["operations"]) == (["pods/eviction"], ["CREATE"])
    assert len(release.of_kind("ValidatingAdmissionPolicyBinding")) == 2


def test_admission_policy_can_be_switched_off(kubeconfig: Path) -> None:
    off = install(kubeconfig, {"tainter": {"admissionPolicy": {"enabled": False}, "replicas": 1}})
    assert not off.of_kind("ValidatingAdmissionPolicy")
    assert not off.of_kind("ValidatingAdmissionPolicyBinding")
    assert not off.of_kind("PodDisruptionBudget")  # one replica: a budget would block drains
    assert off.one("Deployment")["spec"]["replicas"] == 1


def test_lean_profile_passes_the_exporters_lean_flags(releases: dict[str, Release]) -> None:
    """`exporter.profile: lean` adds exactly LEAN_PROFILE_FLAGS to the container running
    nvlink and infiniband; the default (full) adds none of them."""
    lean = _exporter_containers(releases["lean"])
    full = _exporter_containers(releases["defaults"])
    for name, container in lean.items():
        added = [a for a in container["args"] if a not in full[name]["args"]]
        assert added == (list(LEAN_PROFILE_FLAGS) if name == "exporter" else [])
        assert not set(LEAN_PROFILE_FLAGS) & set(full[name]["args"])


def test_the_tainter_authenticates_to_prometheus_from_secrets(
    releases: dict[str, Release], tmp_path: Path
) -> None:
    """`tainter.prometheusClient`: each credential a Secret mounted read-only, named to the
    `--prometheus.*` flags the report and the Slurm health check share; none by default."""
    defaults = _container(releases["defaults"].one("Deployment"))
    assert not [a for a in defaults["args"] if a.startswith("--prometheus.") and "url" not in a]
    deployment = releases["prometheus-client"].one("Deployment")
    container = _container(deployment)
    token = tmp_path / "token"
    token.write_text("secret\n")
    assert {
        "--prometheus.url=https://prometheus.monitoring.svc:9090",
        "--prometheus.basic-auth.username=fleetwatch",
        "--prometheus.basic-auth.password-file=/etc/fleetwatch/prometheus/password/password",
        "--prometheus.tls.ca-file=/etc/fleetwatch/prometheus/ca/ca.crt",
        "--prometheus.tls.cert-file=/etc/fleetwatch/prometheus/client/tls.crt",
        "--prometheus.tls.key-file=/etc/fleetwatch/prometheus/client/tls.key",
        "--prometheus.tls.server-name=prometheus.example",
    } <= set(container["args"])
    args = _parse(
        container["args"], token, _rules_override(releases["prometheus-client"], tmp_path)
    )
    assert deprecated_flags_used(args) == {}
    assert args.prometheus_basic_auth_username == "fleetwatch"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for folder, secret in (
        ("password", "prom-basic"),
        ("ca", "prom-ca"),
        ("client", "prom-client"),
    ):
        name = f"prometheus-{folder}"
        assert mounts[name]["mountPath"] == f"/etc/fleetwatch/prometheus/{folder}"
        assert mounts[name]["readOnly"] is True
        assert volumes[name]["secret"]["secretName"] == secret
