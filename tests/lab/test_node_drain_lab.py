"""Node drain on a real kernel with real traffic: a client outside the node (its
own netns, routed over a LAN veth) holds a connection through a NodePort while the node is
tainted for removal. kube-proxy's health answers 503 within seconds, the connection keeps
working, the node is not quiesced while it lives, and `ipvsctl node-drain --wait` (the
lifecycle hook's step, run in-process against the daemon's HTTP) returns within seconds
after it ends and the grace has passed.

Times are written to $IPVSCTL_LAB_OUT/node-drain-timings.json; the assertions wait on state
with generous timeouts (the guest is slow), never on those times.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, wait_for
from ipvsctl.cli.app import app
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.kernel.netlink import configure_host
from ipvsctl.model import Protocol, ServiceKey
from ipvsctl.reconcile.node_drain import NodeDrain
from tests.lab import netkit
from tests.lab.netkit import NODE_LAN, Outside

pytestmark = pytest.mark.lab

WEB1 = "10.244.0.11"
NODE_PORT = 30080
LB_GRACE = 3.0
TIMINGS: dict[str, float] = {}


def timing(name: str, since: float) -> float:
    TIMINGS[name] = round(time.monotonic() - since, 2)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "node-drain-timings.json"), "w") as f:
            json.dump(TIMINGS, f, indent=1)
    return TIMINGS[name]


def node_object(*taints: str) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
    if taints:
        obj["spec"] = {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]}
    return obj


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_a_tainted_node_fails_health_keeps_its_connection_and_tells_the_hook(
    tmp_path: Path,
) -> None:
    node = Node()
    outside = None
    try:
        configure_host(kernel=node.kernel)
        web1 = node.make_pod(WEB1, name="web-1", tcp=())
        netkit.serve_peers(web1, tcp=(8080,))
        outside = Outside(node)
        manifests, state = tmp_path / "m", tmp_path / "state"
        manifests.mkdir()
        ports = [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}
        ]
        netkit.write_manifests(
            manifests,
            "web.yaml",
            service("web", type="NodePort", ports=ports),
            endpoint_slice(
                "web",
                [endpoint(WEB1, node="node-a", pod="web-1")],
                ports=[{"name": "http", "port": 8080, "protocol": "TCP"}],
            ),
        )
        netkit.write_manifests(manifests, "node.yaml", node_object())
        with netkit.run_daemon(
            node,
            manifests,
            state,
            node_ips=(NODE_LAN,),
            healthz_bind_address="127.0.0.1:0",
            lb_grace=LB_GRACE,
        ) as d:
            wait_for(lambda: d.engine.started, timeout=180, what="first sync")
            wait_for(lambda: d.part(ProxyHealthServer).port, timeout=60, what="the health port")
            health = f"http://127.0.0.1:{d.part(ProxyHealthServer).port}/healthz"
            api = f"http://127.0.0.1:{d.http.port}"
            assert get_json(health)[0] == 200

            held = outside.connect(NODE_LAN, NODE_PORT)  # from outside, through the NodePort
            assert held.pod.startswith("web-1") and held.echo("before the taint")
            key = str(ServiceKey(Protocol.TCP, NODE_LAN, NODE_PORT))
            wait_for(
                lambda: node.ipvsadm()[key].real_servers[f"{WEB1}:8080"].active == 1,
                what="the connection established in IPVS",
            )

            t0 = time.monotonic()
            netkit.write_manifests(manifests, "node.yaml", node_object("karpenter.sh/disrupted"))
            wait_for(lambda: get_json(health)[0] == 503, timeout=60, what="health 503")
            timing("taint_to_health_503_s", t0)
            code, body = get_json(health)
            assert (code, body["nodeEligible"], body["healthy"]) == (503, False, True)

            # draining past the grace, with the connection still established: not quiesced
            wait_for(
                lambda: get_json(api + "/v1/node-quiesced")[1]["unhealthy_for"] > LB_GRACE + 1,
                timeout=60,
                what="past the grace",
            )
            doc = get_json(api + "/v1/node-quiesced")[1]
            assert doc["draining"] and doc["reasons"] == ["taint:karpenter.sh/disrupted"]
            assert (doc["established"], doc["quiesced"]) == (1, False)
            assert held.echo("the established connection still works while the node drains")
            assert d.metrics.value("ipvsctl_node_established_connections") == 1

            result: list[Any] = []
            waiter = threading.Thread(
                target=lambda: result.append(
                    CliRunner().invoke(
                        app, ["node-drain", "--wait", "--timeout", "300", "--endpoint", api]
                    )
                ),
                daemon=True,
            )
            waiter.start()
            # readings later it still waits: the connection lives
            wait_for(lambda: get_json(api + "/v1/node-quiesced")[1]["unhealthy_for"] > 8)
            assert get_json(api + "/v1/node-quiesced")[1]["established"] == 1
            assert waiter.is_alive() and not result

            t1 = time.monotonic()
            held.close()
            # "within seconds" (readings every 0.2 s, polls every 1 s), bounded generously
            # for the emulated guest; the time taken is recorded
            waiter.join(timeout=90)
            assert result, "node-drain --wait did not return within 90 s of the close"
            TIMINGS["connection_closed_to_last_reading_s"] = round(
                d.part(NodeDrain).read_at - t1, 2
            )
            timing("connection_closed_to_node_drain_returned_s", t1)
            out = result[0].output
            assert result[0].exit_code == 0, out
            assert "waiting: draining (taint:karpenter.sh/disrupted)" in out
            assert out.rstrip().endswith("; established 0; quiesced")
            assert get_json(api + "/v1/node-quiesced")[1]["quiesced"] is True
    finally:
        if outside is not None:
            outside.close()
        node.close()
