"""fleetwatch exporter: the DaemonSet process that collects GPU and fabric telemetry."""
