"""The node daemon's features, one module each, each a function `feature(parts)` that builds
its `Feature` record (daemon/feature.py) or None where it has nothing to do on this daemon.
wiring.py's `FEATURES` lists them; they know nothing of each other.

    drain_check        the drain check's background read (the engine's part; its runner the
                       loop's)
    audit              the drift audit's background read (likewise)
    node_drain         this node's own drain: /v1/node-quiesced, the connections through it
    conntrack_sweep    stale UDP/SCTP conntrack entries swept
    netfilter          ipvsctl's nftables table
    health_check_ports healthCheckNodePorts for externalTrafficPolicy: Local load balancers
    proxy_health       kube-proxy's health server on --healthz-bind-address
    service_metrics    the per-Service traffic series
    events             Kubernetes Events for connections a drain's deadline cut
    table_guard        the IPVS table and its addresses put back when another program
                       removes them (kube-proxy's IPVS cleanup, ipvsadm -C)
"""
