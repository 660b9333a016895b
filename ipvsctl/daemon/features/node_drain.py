"""Node drain (docs/node-drain.md): since when this node is leaving (it hears its Node), how
many connections are established through its NodePort, load-balancer and external-IP
virtual servers (it hears the Services, and reads the table in the background), and
/v1/node-quiesced, the answer `ipvsctl node-drain --wait` waits for (this node's clients
only). The running part is reconcile/node_drain.py, the rule plan/node_drain.py."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.httpd import as_json
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.node_drain import NodeDrain
from ipvsctl.reconcile.paced import Pace, PacedRunner

ROUTE = "/v1/node-quiesced"


def feature(p: Parts) -> Feature:
    o = p.options.node_drain
    interval = p.loop.config.drain_check_interval
    drain = NodeDrain(
        p.kernel,
        p.metrics,
        p.clock,
        draining_taints=o.draining_taints,
        lb_grace=o.lb_grace,
        interval=interval,
        ready=lambda: p.view.started,
    )
    # a poll: NodeDrain paces its own reads
    reader = PacedRunner("node-drain", drain, p.loop.lock, Pace(every=interval), clock=p.clock)
    return Feature(
        "node-drain",
        part=drain,
        hears=Subscriptions(service=drain.on_service, node=drain.on_node),
        readers=(reader,),
        # no lock: the answer is made of plain attributes
        routes={ROUTE: lambda q: as_json(200, drain.state().to_json())},
        # from a stranger, a probe of when the node goes away
        local_only=frozenset({ROUTE}),
    )
