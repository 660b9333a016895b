"""Kubernetes objects -> model, pure: the events sources emit (and the ObjectSource port the
API server and manifest adapters implement), conversion (convert, with every field check in
validate; node, hints, duration; shared: one copy of the few-valued strings they repeat), the
event backlog (one waiting event per EndpointSlice) and the object store (which Services an
event touches; its Preparer parses an object where a source decodes it)."""
