"""`ipvsctl status --connections`: each draining real server's connections (client, state,
expiry) from /proc/net/ip_vs_conn, streamed and bounded (at most `limit` each, "N more"),
read by the CLI on the node: the daemon's /status is unchanged."""

from __future__ import annotations

from pathlib import Path

from devkit.builders import endpoint, endpoint_slice
from devkit.harness import rs, vs
from ipvsctl.cli.status import (
    attach_connections,
    join_status,
    read_draining_connections,
    render_status,
)
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.kernel.procfs.codec import ConnEntry, list_connections
from ipvsctl.model import RealServerStatus, VirtualServer, VirtualServerStatus

from .test_audit_status import A, B, started
from .test_proc_codec import A6, HEADER, VS, VS6, v4, v6
from .test_proc_codec import A as PA
from .test_proc_codec import B as PB


def test_lists_each_pairs_connections_bounded():
    lines = [HEADER]
    lines += [v4("ESTABLISHED", cport=f"{0x9C40 + i:04X}", expires=900 - i) for i in range(5)]
    lines += [v4("TIME_WAIT", dest="0AF40106", expires=100)]
    lines += [v4("NONE", cport="0000", expires=300)]  # a persistence template: no connection
    lines += ["TCP garbage 1F90 x\n", "\n"]
    listing = list_connections(lines, [(VS, PA), (VS, PB)], limit=3)
    assert listing.shown[(VS, PA)] == [
        ConnEntry("10.0.0.100:40000", "ESTABLISHED", 900),
        ConnEntry("10.0.0.100:40001", "ESTABLISHED", 899),
        ConnEntry("10.0.0.100:40002", "ESTABLISHED", 898),
    ]
    assert listing.more[(VS, PA)] == 2
    assert listing.shown[(VS, PB)] == [ConnEntry("10.0.0.100:40000", "TIME_WAIT", 100)]
    assert listing.more[(VS, PB)] == 0 and listing.lines == len(lines)


def test_ipv6_clients_are_bracketed():
    listing = list_connections([HEADER, v6("FIN_WAIT")], [(VS6, A6)], limit=5)
    assert listing.shown[(VS6, A6)] == [ConnEntry("[fd01::100]:40000", "FIN_WAIT", 60)]


def joined():
    h = started()
    h.fake.set_connections(vs(), rs(A), active=2)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="web-2")]))
    kernel = [
        VirtualServerStatus(
            VirtualServer(vs()),
            (RealServerStatus(rs(A), 0, 2, 0), RealServerStatus(rs(B), 1, 0, 0)),
        )
    ]
    return join_status(kernel, None, engine_status(h.view), None, "http://x")


def test_status_shows_a_draining_real_servers_connections(tmp_path: Path):
    conn = tmp_path / "ip_vs_conn"
    # rs(A) is 10.244.1.5:8080 = 0AF40105:1F90; 25 established connections to it
    conn.write_text(
        HEADER
        + "".join(v4("ESTABLISHED", cport=f"{0x9C40 + i:04X}", expires=800) for i in range(25))
    )
    doc = joined()
    listing, error = read_draining_connections(doc, limit=20, path=str(conn))
    assert error is None
    attach_connections(doc, listing, error, limit=20)
    (ra,) = [r for r in doc["virtual_servers"][0]["real_servers"] if r["address"] == A]
    assert len(ra["connection_list"]["connections"]) == 20
    assert ra["connection_list"]["more"] == 5
    assert ra["connection_list"]["connections"][0] == {
        "client": "10.0.0.100:40000",
        "state": "ESTABLISHED",
        "expires": 800,
    }
    (rb,) = [r for r in doc["virtual_servers"][0]["real_servers"] if r["address"] == B]
    assert "connection_list" not in rb  # not draining: not listed
    text = render_status(doc)
    assert "10.0.0.100:40000" in text and "ESTABLISHED  expires in 800s" in text
    assert "... 5 more (at most 20 shown)" in text


def test_an_unreadable_table_says_so(tmp_path: Path):
    doc = joined()
    listing, error = read_draining_connections(doc, path=str(tmp_path / "absent"))
    assert listing is None and error and "absent" in error
    attach_connections(doc, listing, error)
    assert "connections not read:" in render_status(doc)
