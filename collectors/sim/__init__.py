"""Simulated hardware: a scenario-driven node whose GPUs and fabric move over time.

`scenario` loads and validates scenario files; `world` turns a scenario and a clock into
the state of every simulated device at any instant; the fake NVML and the generated sysfs
tree read that state, so every collector runs unchanged on a laptop.
"""
