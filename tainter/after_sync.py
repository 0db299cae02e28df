"""What follows a node sync: the node condition, then removal from the run.

Built once from the settings by `tainter.service` and handed to the controller, which
calls `node_synced` with each node as written (or read, when nothing changed) by a sync.
"""

from __future__ import annotations

from typing import Protocol

from fleetwatch.tainter.backend import RemediationApi
from fleetwatch.tainter.condition import ConditionKeeper
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.evict import Evictor
from fleetwatch.tainter.kube_objects import NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.settings import TaintSettings


class AfterSync(Protocol):
    """A step run after each node sync; it reports its own failures, never raises them."""

    async def node_synced(self, node: NodeView) -> None: ...


def after_sync_steps(
    settings: TaintSettings,
    *,
    api: RemediationApi,
    leadership: Leadership,
    metrics: TainterMetrics,
) -> tuple[AfterSync, ...]:
    """The node condition keeper and the evictor, configured (each is idle when its flag
    is empty)."""
    from fleetwatch.rules.config import load_config

    controller = settings.controller
    return (
        ConditionKeeper(
            api=api,
            leadership=leadership,
            metrics=metrics,
            settings=settings.node_condition,
            retry=controller.retry,
            dry_run=controller.dry_run,
        ),
        Evictor(
            api=api,
            leadership=leadership,
            metrics=metrics,
            settings=settings.eviction,
            job_label_keys=load_config(override=settings.rules_config_file).job_label_keys
            if settings.eviction.reasons
            else (),
            retry=controller.retry,
            dry_run=controller.dry_run,
            owner=controller.owner,
        ),
    )
