"""The long-running processes' wiring: the node daemon (`ipvsctl run`: wiring.py builds the
adapters, engine, loop, runners and servers from options) and its HTTP API (api.py,
status_http, status_json), and the shutdown-manager sidecar (shutdown_manager.py). With
obs/, the only package that imports prometheus_client."""
