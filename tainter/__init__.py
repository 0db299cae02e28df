"""The taint controller: Alertmanager webhooks in, guarded Kubernetes node taints out.

An alert asks for a taint with the label `fleetwatch_taint` (a short reason); the tainter
keeps, per (node, taint key), the set of firing alerts that want it, adds the taint when the
set becomes non-empty and removes it only on positive evidence from Prometheus.
"""
