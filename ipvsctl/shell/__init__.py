"""The outer layer: CLI, HTTP server and the daemon's wiring (the only place that imports
typer, and with obs/ the only one that imports prometheus_client)."""
