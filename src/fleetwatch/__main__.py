"""`python -m fleetwatch` runs the fleetwatch CLI."""

from fleetwatch.cli import main

raise SystemExit(main())
