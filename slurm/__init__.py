"""Slurm fleets: which job holds which GPU (the prolog/epilog mapping directory, also in
dcgm-exporter's format), Slurm's own health check, and the `scontrol` wrapper the health
check and the drain controller share.

What runs for every job (`fleetwatch slurm prolog|epilog`) imports only the standard
library and this package's `mapping` module: it is on every job's start and end path.
"""
