"""Kubernetes objects -> model: the events sources emit, pure conversion, the object store."""
