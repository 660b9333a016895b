"""The netlink adapter's pure parts, on the host: error mapping, message building and
parsing, sysctl planning. The kernel behaviour itself is tested in tests/lab."""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from devkit.fakenetlink import IPVSModel, model_sockets
from ipvsctl.kernel import (
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelTransient,
    KernelUnavailable,
    netns,
)
from ipvsctl.kernel.netlink import NetlinkKernel
from ipvsctl.kernel.netlink.codec import (
    IPVSTimeouts,
    decode_u32,
    dest_spec,
    ipvs_config_msg,
    real_server_from_message,
    service_key_spec,
    service_spec,
    timeouts_from_message,
    timeouts_message,
    virtual_server_from_message,
)
from ipvsctl.kernel.netlink.errors import (  # NetlinkError: pyroute2's, as the adapter sees it
    DestSubject,
    NetlinkError,
    errors,
    translate_error,
)
from ipvsctl.kernel.procfs import sysctl
from ipvsctl.model import Protocol, RealServerKey, RealServerStatus, ServiceKey, VirtualServer


def attrs(spec: Any) -> dict[str, Any]:
    return dict(spec.dump_nla()["attrs"])


# --- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (errno.ENOENT, KernelNotFound),
        (errno.ESRCH, KernelNotFound),
        (errno.EEXIST, KernelExists),
        (errno.EPERM, KernelPermissionDenied),
        (errno.EACCES, KernelPermissionDenied),
        (errno.EINVAL, KernelTransient),
        (errno.ENOBUFS, KernelTransient),
    ],
)
def test_netlink_errors_are_translated(code: int, cls: type[KernelError]) -> None:
    err = translate_error(NetlinkError(code), "add_real_server", "10.0.0.1:80/TCP -> x")
    assert type(err) is cls
    assert err.operation == "add_real_server"
    assert "10.0.0.1:80/TCP" in str(err) and os.strerror(code) in str(err)


def test_os_errors_are_translated_too() -> None:
    assert isinstance(translate_error(OSError(errno.EEXIST, "x"), "op"), KernelExists)
    assert isinstance(translate_error(OSError(errno.ECONNRESET, "x"), "op"), KernelTransient)
    assert isinstance(translate_error(RuntimeError("loop closed"), "op"), KernelTransient)


def test_unknown_scheduler_message_says_which_module() -> None:
    with (
        pytest.raises(KernelNotFound, match="modprobe ip_vs_mh"),
        errors("add_virtual_server", "x", scheduler="mh"),
    ):
        raise NetlinkError(errno.ENOENT)


def test_a_failed_dest_call_names_both_servers_formatted_only_then() -> None:
    formatted: list[str] = []

    class Key(ServiceKey):
        def __str__(self) -> str:
            formatted.append("vs")
            return ServiceKey.__str__(self)

    key, rs = Key(Protocol.TCP, "10.96.0.1", 80), RealServerKey("10.244.1.5", 8080)
    with errors("add_real_server", DestSubject(key, rs)):
        pass
    assert formatted == []  # the success path builds no message
    with (
        pytest.raises(
            KernelExists, match=r"add_real_server 10\.96\.0\.1:80/TCP -> 10\.244\.1\.5:8080"
        ),
        errors("add_real_server", DestSubject(key, rs)),
    ):
        raise NetlinkError(errno.EEXIST)
    with pytest.raises(ValueError), errors("add_real_server", DestSubject(key, rs)):
        raise ValueError("not netlink's: goes on as it is")


# --- messages -------------------------------------------------------------------------------
def test_ipv4_service_spec() -> None:
    vs = VirtualServer(ServiceKey(Protocol.UDP, "10.96.0.10", 53), "rr", 0)
    a = attrs(service_spec(vs))
    assert a["IPVS_SVC_ATTR_AF"] == socket.AF_INET
    assert a["IPVS_SVC_ATTR_PROTOCOL"] == socket.IPPROTO_UDP
    assert (a["IPVS_SVC_ATTR_ADDR"], a["IPVS_SVC_ATTR_PORT"]) == ("10.96.0.10", 53)
    assert a["IPVS_SVC_ATTR_NETMASK"] == "255.255.255.255"
    assert a["IPVS_SVC_ATTR_SCHED_NAME"] == "rr"
    # only the persistent and scheduler bits are ours: a "set" keeps any other flag as it is
    assert a["IPVS_SVC_ATTR_FLAGS"] == {"flags": 0, "mask": 0x39}
    assert a["IPVS_SVC_ATTR_TIMEOUT"] == 0


def test_ipv6_persistent_sctp_service_spec() -> None:
    vs = VirtualServer(ServiceKey(Protocol.SCTP, "fd96::10", 99), "sh", 10800)
    a = attrs(service_spec(vs))
    assert a["IPVS_SVC_ATTR_AF"] == socket.AF_INET6
    assert a["IPVS_SVC_ATTR_PROTOCOL"] == 132
    # the kernel reads the netmask as a host-order u32 prefix length: 128 for IPv6
    assert struct.unpack("=I", socket.inet_aton(a["IPVS_SVC_ATTR_NETMASK"]))[0] == 128
    assert a["IPVS_SVC_ATTR_FLAGS"] == {"flags": 1, "mask": 0x39}
    assert a["IPVS_SVC_ATTR_TIMEOUT"] == 10800


def test_scheduler_flags_in_the_spec_and_back() -> None:
    """mh with mh-port (0x10, IP_VS_SVC_F_SCHED2) as kube-proxy programs it, read back."""
    vs = VirtualServer(ServiceKey(Protocol.TCP, "10.96.0.10", 80), "mh", 0, 0x10)
    assert attrs(service_spec(vs))["IPVS_SVC_ATTR_FLAGS"] == {"flags": 0x10, "mask": 0x39}
    vs = VirtualServer(ServiceKey(Protocol.TCP, "10.96.0.10", 80), "sh", 60, 0x08 | 0x20)
    assert attrs(service_spec(vs))["IPVS_SVC_ATTR_FLAGS"] == {"flags": 0x29, "mask": 0x39}
    m = service_message(
        af=2,
        protocol=6,
        addr="10.96.0.10",
        port=80,
        sched_name="mh",
        flags={"flags": 0x2 | 0x10 | 0x40, "mask": 0xFFFFFFFF},
        timeout=0,
    )
    assert virtual_server_from_message(m) == VirtualServer(
        ServiceKey(Protocol.TCP, "10.96.0.10", 80), "mh", 0, 0x10
    )


def test_service_key_spec_carries_only_the_identity() -> None:
    key = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
    assert dict(service_key_spec(key).dump_key()["attrs"]) == {
        "IPVS_SVC_ATTR_AF": socket.AF_INET,
        "IPVS_SVC_ATTR_PROTOCOL": 6,
        "IPVS_SVC_ATTR_ADDR": "10.96.0.10",
        "IPVS_SVC_ATTR_PORT": 80,
    }


def test_real_servers_are_nat_not_pyroute2s_direct_routing_default() -> None:
    a = attrs(dest_spec(RealServerKey("10.244.1.5", 8080), 0))
    assert a["IPVS_DEST_ATTR_FWD_METHOD"] == 0
    assert a["IPVS_DEST_ATTR_WEIGHT"] == 0
    assert (a["IPVS_DEST_ATTR_ADDR"], a["IPVS_DEST_ATTR_PORT"]) == ("10.244.1.5", 8080)


def test_timeouts_message_sets_only_non_zero_values() -> None:
    assert timeouts_message(0, 0, 0) is None
    with pytest.raises(ValueError, match="tcpfin"):
        timeouts_message(900, -1, 0)
    msg = timeouts_message(tcp=900, udp=30)
    assert msg is not None
    msg.encode()
    back = ipvs_config_msg(msg.data)
    back.decode()
    assert back["cmd"] == 12  # IPVS_CMD_SET_CONFIG
    assert back.get_attr("IPVS_CMD_ATTR_TIMEOUT_TCP") == 900
    assert back.get_attr("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN") is None
    assert back.get_attr("IPVS_CMD_ATTR_TIMEOUT_UDP") == 30


def test_get_config_reply_as_pyroute2_decodes_it() -> None:
    # pyroute2's ipvsmsg types the timeouts as "hex": what a 6.1 kernel's defaults look like
    reply = Stub(
        attrs={
            "IPVS_CMD_ATTR_TIMEOUT_TCP": "84:03:00:00",
            "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN": "78:00:00:00",
            "IPVS_CMD_ATTR_TIMEOUT_UDP": "2c:01:00:00",
        }
    )
    if struct.pack("=I", 1) == b"\x01\x00\x00\x00":
        assert timeouts_from_message(reply) == IPVSTimeouts(tcp=900, tcpfin=120, udp=300)
    assert decode_u32(17) == 17


# --- parsing dumps --------------------------------------------------------------------------
class Stub:
    """A netlink message for the read API the codec uses: m.get((nla, field)) for IPVS
    dumps, m.get_attr(name) for config messages."""

    def __init__(
        self, fields: dict[tuple[str, str], Any] | None = None, attrs: dict[str, Any] | None = None
    ) -> None:
        self.fields, self.attrs = fields or {}, attrs or {}

    def get(self, key: tuple[str, str]) -> Any:
        return self.fields.get(key)

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)


def service_message(**fields: Any) -> Stub:
    return Stub({("service", k): v for k, v in fields.items()})


def test_virtual_server_from_dump() -> None:
    m = service_message(
        af=10,
        protocol=6,
        addr="fd96:0:0::10",
        port=80,
        sched_name="sh",
        flags={"flags": 3, "mask": 0xFFFFFFFF},
        timeout=300,
    )
    assert virtual_server_from_message(m) == VirtualServer(
        ServiceKey(Protocol.TCP, "fd96::10", 80), "sh", 300
    )
    # flag 2 is IP_VS_SVC_F_HASHED, always set by the kernel; the timeout counts only with
    # the persistent flag
    m = service_message(
        af=2,
        protocol=17,
        addr="10.96.0.10",
        port=53,
        sched_name="rr",
        flags={"flags": 2, "mask": 0xFFFFFFFF},
        timeout=300,
    )
    assert virtual_server_from_message(m) == VirtualServer(
        ServiceKey(Protocol.UDP, "10.96.0.10", 53), "rr", 0
    )


def test_fwmark_and_unknown_protocol_services_are_not_ours() -> None:
    assert virtual_server_from_message(service_message(af=2, fwmark=5, sched_name="rr")) is None
    assert (
        virtual_server_from_message(service_message(af=2, protocol=33, addr="10.0.0.1", port=1))
        is None
    )


def test_real_server_from_dump() -> None:
    m = Stub(
        {
            ("dest", "addr"): "10.244.1.5",
            ("dest", "port"): 8080,
            ("dest", "weight"): 0,
            ("dest", "active_conns"): 2,
            ("dest", "inact_conns"): 7,
            ("dest", "fwd_method"): 0,
        }
    )
    assert real_server_from_message(m) == RealServerStatus(
        RealServerKey("10.244.1.5", 8080), 0, 2, 7
    )


# --- constructor errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("loaded", "code", "cls", "text"),
    [
        (False, None, KernelUnavailable, "modprobe ip_vs"),  # no IPVS family: open says ENOENT
        (True, errno.EPERM, KernelPermissionDenied, "CAP_NET_ADMIN"),
        (True, errno.EIO, KernelTransient, "open IPVS"),
    ],
)
def test_constructor_errors(
    loaded: bool, code: int | None, cls: type[KernelError], text: str
) -> None:
    model = IPVSModel()
    model.loaded, model.config_error = loaded, code
    with pytest.raises(cls, match=text):
        NetlinkKernel(create_interface=False, sockets=model_sockets(model))


@pytest.mark.skipif(os.path.exists("/proc/net/ip_vs"), reason="this kernel has IPVS")
def test_constructor_on_a_kernel_without_ipvs() -> None:
    with pytest.raises(KernelUnavailable, match="modprobe ip_vs"):
        NetlinkKernel(create_interface=False)


def test_constructor_with_a_missing_netns() -> None:
    with pytest.raises(KernelUnavailable, match="not found"):
        NetlinkKernel(netns="ipvsctl-no-such-netns")


# --- procfs's sysctls and network namespaces ----------------------------------------------
def test_kernel_versions() -> None:
    assert sysctl.parse_kernel_version("6.1.0-56-amd64") == (6, 1)
    assert sysctl.parse_kernel_version("5.10.0") == (5, 10)
    with pytest.raises(ValueError):
        sysctl.parse_kernel_version("unknown")


def test_conn_reuse_mode_only_before_5_9() -> None:
    assert sysctl.wanted_sysctls("4.19.0-20-amd64")["net.ipv4.vs.conn_reuse_mode"] == "0"
    assert sysctl.wanted_sysctls("5.8.18")["net.ipv4.vs.conn_reuse_mode"] == "0"
    for release in ("5.9.0", "5.10.0-30-amd64", "6.1.0-56-amd64"):
        assert "net.ipv4.vs.conn_reuse_mode" not in sysctl.wanted_sysctls(release)
    assert sysctl.wanted_sysctls("6.1.0") == {
        "net.ipv4.vs.conntrack": "1",
        "net.ipv4.vs.expire_nodest_conn": "0",
        "net.ipv4.vs.expire_quiescent_template": "1",
        "net.ipv4.ip_forward": "1",
    }


def fake_proc_sys(root: Any, values: dict[str, str]) -> str:
    for name, value in values.items():
        path = sysctl.sysctl_path(name, str(root))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(value + "\n")
    return str(root)


def test_apply_sysctls_writes_only_what_differs(tmp_path: Any) -> None:
    proc = fake_proc_sys(tmp_path, {"net.ipv4.vs.conntrack": "0", "net.ipv4.ip_forward": "1"})
    wanted = {"net.ipv4.vs.conntrack": "1", "net.ipv4.ip_forward": "1"}
    assert sysctl.apply_sysctls(wanted, proc_sys=proc) == {"net.ipv4.vs.conntrack": "1"}
    assert sysctl.read_sysctl("net.ipv4.vs.conntrack", proc_sys=proc) == "1"
    assert sysctl.apply_sysctls(wanted, proc_sys=proc) == {}


def test_missing_ipvs_sysctls_say_to_load_ip_vs(tmp_path: Any) -> None:
    proc = fake_proc_sys(tmp_path, {"net.ipv4.ip_forward": "1"})
    with pytest.raises(KernelUnavailable, match="modprobe ip_vs"):
        sysctl.apply_sysctls({"net.ipv4.vs.conntrack": "1"}, proc_sys=proc)


def test_run_in_netns() -> None:
    assert netns.run_in_netns(None, lambda: 42) == 42
    with pytest.raises(KernelUnavailable, match="not found"):
        netns.run_in_netns("ipvsctl-no-such-netns", lambda: 42)
    assert netns.netns_path("n1") == "/run/netns/n1"
    assert netns.netns_path("/proc/1/ns/net") == "/proc/1/ns/net"


# --- expire_nodest_conn around the daemon's own deletions ---------------------------------
def test_a_deletion_runs_with_expire_nodest_conn_at_1_and_puts_back_0(tmp_path: Path) -> None:
    """Between deletions the sysctl is 0 (a table another program flushes keeps its
    connections); a deletion of ipvsctl's own runs with 1 (its connections end, each client
    is told at its next packet), and it is 0 again after, also when the deletion fails."""
    root = fake_proc_sys(tmp_path, {sysctl.EXPIRE_NODEST_CONN: "0"})
    expire = sysctl.ExpireOnDelete(proc_sys=root)
    during = []
    with expire.around():
        during.append(sysctl.read_sysctl(sysctl.EXPIRE_NODEST_CONN, proc_sys=root))
    with pytest.raises(KernelNotFound), expire.around():
        raise KernelNotFound("gone", "delete_real_server")
    assert during == ["1"]
    assert sysctl.read_sysctl(sysctl.EXPIRE_NODEST_CONN, proc_sys=root) == "0"
    assert expire.writes == 4
    expire.close()


def test_a_node_left_at_1_is_not_written(tmp_path: Path) -> None:
    root = fake_proc_sys(tmp_path, {sysctl.EXPIRE_NODEST_CONN: "1"})
    expire = sysctl.ExpireOnDelete(proc_sys=root)
    with expire.around():
        pass
    assert expire.writes == 0
    assert sysctl.read_sysctl(sysctl.EXPIRE_NODEST_CONN, proc_sys=root) == "1"


def test_a_missing_sysctl_never_stops_a_deletion(tmp_path: Path) -> None:
    expire = sysctl.ExpireOnDelete(proc_sys=str(tmp_path))  # no such file: no IPVS sysctls
    done = []
    with expire.around():
        done.append(True)
    assert done == [True] and expire.writes == 0


def test_in_the_daemonset_the_hosts_mounted_sysctl_is_the_one_written(tmp_path: Path) -> None:
    host = fake_proc_sys(tmp_path / "host", {sysctl.EXPIRE_NODEST_CONN: "0"})
    assert sysctl.writable_proc_sys(None, host=host) == host
    assert sysctl.writable_proc_sys("lab1", host=host) == sysctl.PROC_SYS
    assert sysctl.writable_proc_sys(None, host=str(tmp_path / "none")) == sysctl.PROC_SYS


def test_the_interface_lookup_is_one_get_the_kernel_answers() -> None:
    """On the host's own rtnetlink (no IPVS needed): the hand-packed RTM_GETLINK finds an
    interface by name and says ENODEV as absent, never raising for it."""
    from ipvsctl.kernel.netlink.interface import DummyInterface
    from ipvsctl.kernel.netlink.sockets import Sockets

    sockets = Sockets(None)
    try:
        assert DummyInterface(sockets, "lo").present()
        assert not DummyInterface(sockets, "ipvsctl-none0").present()
    finally:
        sockets.close()
