"""What only the tests and the benchmarks use (not installed).

`tool_servers` adds the test-only servers and tools (node_exporter, promtool, PromQL queries, an
app served from a thread) to the harness the package ships as `fleetwatch.sim.loopback_servers`;
`stack` runs the package's whole alerting path (`fleetwatch.sim.stack`) on a node that
heats and cools, with shortened timings; `clock` freezes a simulated node's time. Tests and
benches both import it, so neither imports the other.
"""
