"""The cluster lab: several nodes in one lab VM, rollouts under load, failures counted.

Every node is a network namespace with its own IPVS table, `kube-ipvs0`, nftables and
conntrack, and its own `ipvsctl run` process (a real daemon, started as a DaemonSet would
start it) following one fake API server (devkit.fakeapi, the real wire protocol). A stand-in
for the kubelet and the Deployment and EndpointSlice controllers plays Kubernetes' moves;
clients on every node and outside, behind a load balancer that health-checks each node's
`:10256/healthz`, count every failed request, reset and cut stream with its time.

Modules, bottom up:
- `net`: the networks (a node bridge, routed pod CIDRs, the outside network) and the nodes.
- `lb`: the external load balancer stand-in: IPVS in its own namespace and a health checker.
- `daemons`: `ipvsctl run` per node as a process (start, SIGTERM, SIGKILL, SIGSTOP), its log,
  and `ipvsctl node-drain` run on a node.
- `kube`: pure: the objects the controllers publish (Services, EndpointSlices with their
  conditions and hints, Nodes) from the lab's state.
- `control`: the control plane's moves: pods (an app, a kubelet, a shutdown-manager
  sidecar), rolling updates, scaling, eviction, taints, Services deleted and created.
- `load`: short requests, long-lived streams and DNS-like UDP queries, every outcome timed.
- `report`: pure: a scenario's records into its row (failed, resets, cut streams, p99).
- `scenarios`: the scenarios, each run with ipvsctl as shipped and with draining off.
- `cluster`: the whole lab put together; `__main__`: `python -m clusterlab` (make cluster-lab).
"""
