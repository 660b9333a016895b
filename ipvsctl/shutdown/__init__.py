"""The shutdown barrier behind `ipvsctl shutdown-manager` (docs/shutdown-manager.md).

An application pod's preStop hook asks a sidecar to wait until every node's ipvsctl daemon
has stopped sending the pod new connections, and then until the pod's own established
connections fall to a minimum, never longer than a timeout. Layers, top to bottom:

  barrier   the pure state machine: observations and the time in, the next action out
  probes    adapters: DNS lookup of the daemons, GET /v1/quiesced, /proc/net/tcp{,6}
  runner    drives a barrier with probes, an injected clock and sleep; one shared barrier
            for any number of concurrent callers

The sidecar is wired in `ipvsctl.daemon.shutdown_manager`, its command in
`ipvsctl.cli.shutdown_manager`.
"""

DEFAULT_DAEMON_SERVICES = (
    "ipvsctl-metrics.ipvsctl-system.svc.cluster.local",
    "ipvsctl-metrics.kube-system.svc.cluster.local",
)
"""The DaemonSet's headless metrics Service, one A/AAAA record per daemon, in each namespace
ipvsctl ships for: its own (daemonset/) and kube-proxy's (daemonset/kube-proxy-takeover).
A name that does not exist is skipped; the daemons are those of every name that does."""
DEFAULT_DAEMON_PORT = 9796
"""The daemons' --listen port (/metrics, /v1/quiesced, ...)."""
