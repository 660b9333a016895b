"""ipvsctl: a per-node Kubernetes service proxy on Linux IPVS with graceful termination."""

__version__ = "0.1.0"
