"""Grafana dashboards in grafanalib: one module per dashboard and the panel builders they
share; `write_dashboards.py` renders them as the JSON the chart ships (a package so the
generate step and the tests import it)."""
