"""The Helm chart: `write_chart.py` renders its derived parts (a package so the generate step and
the tests import it)."""
