"""The Kubernetes API adapter: the only package that may import the `kubernetes` client."""
