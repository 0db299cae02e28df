"""The report's NVLink-domain view on frames shaped as the store returns them: GPUs and
nodes per domain, GPUs with a degraded or unregistered fabric, and the jobs that span a
degraded domain (the PromQL itself runs against real Prometheus with the fleet history)."""

from __future__ import annotations

import pandas as pd

from fleetwatch.report.analysis import nvlink_domains
from fleetwatch.report.dataset import Dataset
from fleetwatch.report.query import Window
from fleetwatch.report.section import Section

WINDOW = Window(start=0, end=3600, step=60, bucket=600, threshold_celsius=78)


def _gpu(node: str, gpu: int, clique: str) -> dict[str, object]:
    return {
        "node": node,
        "gpu": str(gpu),
        "uuid": f"GPU-{node}-{gpu}",
        "cluster_uuid": "c-a",
        "clique_id": clique,
        "timestamp": 3600,
        "value": 1.0,
    }


def _dataset(*, with_fabric: bool = True) -> Dataset:
    domain = [_gpu(n, g, "1") for n in ("n1", "n2") for g in (0, 1)] + [_gpu("n3", 0, "2")]
    unhealthy = [{"node": "n2", "gpu": "1", "uuid": "GPU-n2-1", "timestamp": 3600, "value": 600}]
    owned = pd.DataFrame(
        [
            {
                "node": n,
                "gpu": "0",
                "uuid": f"GPU-{n}-0",
                "namespace": "ml",
                "pod": p,
                "timestamp": t,
            }
            for n, p in (("n1", "llm-0"), ("n2", "llm-1"), ("n3", "solo-0"))
            for t in (600, 1200)
        ]
    )
    pod_jobs = pd.DataFrame(
        [
            {"namespace": "ml", "pod": "llm-0", "training_job": "llm", "timestamp": 600},
            {"namespace": "ml", "pod": "llm-1", "training_job": "llm", "timestamp": 600},
        ]
    )
    frames = {"pod_jobs": pod_jobs, "owned": owned}
    if with_fabric:
        frames |= {
            "domain_gpus": pd.DataFrame(domain),
            "fabric_unhealthy_seconds": pd.DataFrame(unhealthy),
        }
    return Dataset(window=WINDOW, frames=frames)


def test_domains_count_gpus_nodes_unhealthy_gpus_and_list_their_jobs() -> None:
    ds = _dataset()
    section = Section("Fabric")
    nvlink_domains(ds, ds.frames["owned"], section)
    domains = section.tables["nvlink_domains"]
    rows = {r.clique_id: r for r in domains.itertuples()}
    assert (rows["1"].gpus, rows["1"].nodes, rows["1"].unhealthy_gpus) == (4, 2, 1)
    assert rows["1"].unhealthy_gpu_minutes == 10.0
    assert rows["1"].jobs == "ml/llm"
    assert (rows["2"].gpus, rows["2"].unhealthy_gpus, rows["2"].jobs) == (1, 0, "ml/solo-0")
    assert list(domains["clique_id"]) == ["1", "2"]  # the degraded domain first
    spanning = section.tables["jobs_in_degraded_domains"]
    assert spanning.to_dict("records") == [
        {
            "namespace": "ml",
            "training_job": "llm",
            "cluster_uuid": "c-a",
            "clique_id": "1",
            "gpus_in_domain": 2,
        }
    ]
    assert section.notes == []


def test_no_fabric_in_the_window_adds_no_domain_tables() -> None:
    ds = _dataset()
    ds.frames["domain_gpus"] = ds.frames["domain_gpus"].iloc[0:0]
    section = Section("Fabric")
    nvlink_domains(ds, ds.frames["owned"], section)
    assert section.tables == {}
    assert section.notes == []


def test_a_query_that_did_not_run_is_named() -> None:
    ds = _dataset(with_fabric=False)
    ds.problems["domain_gpus"] = "the store refused the query"
    section = Section("Fabric")
    nvlink_domains(ds, ds.frames["owned"], section)
    assert section.tables == {}
    assert section.notes == ["domain_gpus: the store refused the query"]
