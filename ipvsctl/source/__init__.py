"""Kubernetes objects -> model, pure: the events sources emit, raw or prepared (and the
ObjectSource port the API server and manifest adapters implement), the Preparer that parses
an object with the node's configuration (prepare: where a source decodes it, or at the
engine's intake), conversion (convert, with every field check in validate; node, hints,
duration; shared: one copy of the few-valued strings they repeat), the event backlog (one
waiting event per EndpointSlice) and the object store (which Services an event touches)."""
