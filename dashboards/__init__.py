"""Grafana dashboards: `generate.py` writes them (a package so the chart generator and the
tests import it)."""
