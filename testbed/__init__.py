"""Real servers on loopback for the tests and the benchmarks (not installed).

`servers` starts Prometheus, Alertmanager, node_exporter and fleetwatch's own commands as
real processes on free loopback ports with temporary directories, and stops them by PID;
`stack` wires the whole alerting path (simulated cluster, exporter, Prometheus, tainter,
Alertmanager) together. Tests and benches both import it, so neither imports the other.
"""
