"""The exporter shows the web config's reload figures in its self-metrics, only when it
serves under `--web.config.file`, and renders them again after a reload."""

from __future__ import annotations

from dataclasses import dataclass

from fleetwatch.exporter.engine import Engine


@dataclass
class Reloads:
    reload_errors: int = 0
    last_reload_success: float = 1_700_000_000.0


def test_reload_figures_are_self_metrics_after_each_reload() -> None:
    reloads = Reloads()
    engine = Engine(
        collectors=[], max_staleness=1, hang_timeout=5, version="test", web_config=reloads
    )
    assert "fleetwatch_web_config_reload_errors_total 0.0" in engine.exposition().decode()
    reloads.reload_errors = 1
    engine.web_config_reloaded(False)
    text = engine.exposition().decode()
    assert "fleetwatch_web_config_reload_errors_total 1.0" in text
    assert "fleetwatch_web_config_last_reload_success_timestamp_seconds 1.7e+09" in text


def test_no_web_config_no_reload_figures() -> None:
    engine = Engine(collectors=[], max_staleness=1, hang_timeout=5, version="test")
    assert "fleetwatch_web_config" not in engine.exposition().decode()
