"""ipvsctl's one HTTP server, for every listener (the daemon's --listen, kube-proxy's
health port, the healthCheckNodePorts, the shutdown-manager): bounded per peer (an IPv4
address or an IPv6 /64), probes answered inline, never behind other requests, GET and HEAD
only, slow clients cut (server.py); pure request framing and parsing (request.py);
a route table on top (routes.py); the one way a listener is opened and the one way
ipvsctl's own requests go out, never through a proxy (sockets.py)."""

from ipvsctl.httpd.request import (
    Body,
    Handle,
    Park,
    Request,
    Response,
    Waiter,
    is_loopback_peer,
    peer_key,
)
from ipvsctl.httpd.routes import Handler, HTTPServer, as_json, text
from ipvsctl.httpd.server import REASONS, BoundedServer, Limits
from ipvsctl.httpd.sockets import direct_opener, listen_socket

__all__ = [
    "REASONS",
    "Body",
    "BoundedServer",
    "HTTPServer",
    "Handle",
    "Handler",
    "Limits",
    "Park",
    "Request",
    "Response",
    "Waiter",
    "as_json",
    "direct_opener",
    "is_loopback_peer",
    "listen_socket",
    "peer_key",
    "text",
]
