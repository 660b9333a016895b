"""IPVS and the host through /proc (no netlink, no pyroute2):

- ipvs: the readers of /proc/net/ip_vs (real servers with weights and counts, one read) and
  /proc/net/ip_vs_conn (connections by state, streamed); codec: their pure parsing
- sysctl: the sysctls an IPVS service proxy relies on, through /proc/sys
"""
