"""Metrics and logging: the only place besides shell/ that imports prometheus_client."""
