"""Built-in scenario files (`fleetwatch export --simulate list`)."""
