"""kube-proxy's health answers, each rule beside its server:
- the healthCheckNodePorts of `externalTrafficPolicy: Local` LoadBalancer Services: state
  (pure: ports, Services, local endpoint counts, the answer) and server (every port, one
  thread);
- the node's health on --healthz-bind-address (:10256, /healthz and /livez): proxy (pure:
  the answer from the daemon's state) and proxy_server (the listener, retried while the port
  is taken)."""
