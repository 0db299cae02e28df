"""`python -m exporter` runs the fleetwatch CLI."""

from exporter.cli import main

raise SystemExit(main())
