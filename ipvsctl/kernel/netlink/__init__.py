"""IPVS and the dummy interface over netlink: the only package that imports pyroute2
(.importlinter), one module per concern (as kube-proxy splits pkg/util/ipvs, its netlink
address code and pkg/proxy/conntrack):

- adapter: NetlinkKernel (the IPVSKernel port, composed of what follows), configure_host,
  read_host_statuses
- codec: the IPVS messages as pyroute2 builds and parses them (pure); wire: the same
  messages, and the address add/del, packed by hand (byte-equal), and the dump answers
  parsed by hand
- errors: the one place where netlink errors become KernelErrors
- sockets: pyroute2's sockets, one set per calling thread; raw: those sockets used raw for
  wire's messages (a request, dumps back to back, a batch of dest adds in one send)
- ipvs_calls: the IPVS commands; interface: the dummy interface (`kube-ipvs0`) and the
  index of addresses in use
- conntrack: the conntrack table (filtered dumps, deletes by original tuple), for the
  stale-entry sweep and for a removed UDP/SCTP real server's flush
- addresses: this node's addresses (the default --node-ip), and those on the Kubernetes
  proxies' dummy interfaces (whose virtual servers may be taken over); address_watch: every
  address of the node, followed from rtnetlink's notifications (Node safety)
- system_host: what `ipvsctl cleanup` removes (IPVS table, dummy interface)
"""

from ipvsctl.kernel.netlink.adapter import NetlinkKernel, configure_host, read_host_statuses
from ipvsctl.kernel.netlink.addresses import interface_addresses

__all__ = ["NetlinkKernel", "configure_host", "interface_addresses", "read_host_statuses"]
