"""Metrics and logging: the only place besides daemon/ that imports prometheus_client."""
