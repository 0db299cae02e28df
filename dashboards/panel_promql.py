"""The PromQL the dashboards show, built from the alert rules' own definitions.

Selectors, thresholds, rate records and the training-job records come from the rules
generator with the config it validated, so a dashboard never disagrees with the alerts.
"""

from __future__ import annotations

from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_DATA_BYTES_TOTAL,
    INFINIBAND_PORT_ERRORS_TOTAL,
)
from fleetwatch.catalog.nvlink import NVLINK_ERRORS_TOTAL
from fleetwatch.report.storage_queries import (
    JOB_CHECKPOINT_BURST,
    JOB_CHECKPOINT_WRITE,
    NODE_CHECKPOINT_WRITE,
)
from fleetwatch.rules import definitions, promql
from fleetwatch.rules.config import Config, parameters


class Queries:
    """PromQL for the dashboards, built with the alert rules' own selectors and names."""

    def __init__(self, config: Config) -> None:
        self.job = config.exporter_selector
        self._q = promql.Promql(config)
        params = parameters(config)
        self.gpu_limit = float(params["thresholds.gpu_temperature_celsius"])
        self.memory_limit = float(params["thresholds.memory_temperature_celsius"])
        self.nvlink_rate = self._q.rate_name("node_gpu_link", NVLINK_ERRORS_TOTAL.name)
        self.ib_rate = self._q.rate_name("node_device_port", INFINIBAND_PORT_ERRORS_TOTAL.name)
        self.ib_data_rate = self._q.rate_name(
            "node_device_port", INFINIBAND_PORT_DATA_BYTES_TOTAL.name
        )
        self.fabric_errors = definitions.fabric_errors_record(config)
        # The training-job recording rules (fleetwatch:gpu_job:info and the per-job records).
        self.job_info = definitions.JOB_INFO
        self.job_tensor = definitions.JOB_TENSOR
        self.job_tensor_median = definitions.JOB_TENSOR_MEDIAN
        self.job_sm_clock = definitions.JOB_SM_CLOCK
        self.job_sm_clock_median = definitions.JOB_SM_CLOCK_MEDIAN
        self.job_checkpoint_write = JOB_CHECKPOINT_WRITE
        self.node_checkpoint_write = NODE_CHECKPOINT_WRITE
        self.job_checkpoint_burst = JOB_CHECKPOINT_BURST

    def exporter(self, metric: str, *matchers: str) -> str:
        """`metric` from the exporter's scrape job, with extra label `matchers`."""
        return str(self._q.exporter(metric, *matchers))

    def tainter(self, metric: str, *matchers: str) -> str:
        """`metric` from the taint controller's scrape job, with extra label `matchers`."""
        return str(self._q.tainter(metric, *matchers))
