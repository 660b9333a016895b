"""The long-running processes' wiring: the node daemon (`ipvsctl run`: options.py completes
its options group by group, with config_file.py's kube-proxy file; wiring.py builds the
adapters, engine, loop, runners and servers from them) and its HTTP API (api.py,
status_http, status_json), and the shutdown-manager sidecar (shutdown_manager.py). With
obs/, the only package that imports prometheus_client."""
