"""Alert and recording rules: `generate.py` writes them from config.yaml (a package so the
dashboard and chart generators, and the tests, import it)."""
