"""Kubernetes objects -> model, pure: the events sources emit (and the ObjectSource port the
API server and manifest adapters implement), conversion (convert, with every field check in
validate; node, hints, duration) and the object store (which Services an event touches)."""
