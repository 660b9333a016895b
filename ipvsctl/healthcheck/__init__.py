"""kube-proxy's healthCheckNodePort for `externalTrafficPolicy: Local` LoadBalancer Services:
state (pure: ports, Services, local endpoint counts, the answer) and server (the sockets)."""
