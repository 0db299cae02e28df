"""The Helm chart: `generate.py` writes its generated parts (a package so the tests import
it)."""
