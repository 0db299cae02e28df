"""Benchmarks: scripts that print figures (never timed tests), and their shared helpers."""
