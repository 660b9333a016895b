#!/usr/bin/env bash
# Prepares a Linux node for ipvsctl: loads the IPVS kernel modules and sets the sysctls an
# IPVS service proxy relies on (the ones kube-proxy's IPVS mode sets, but
# expire_nodest_conn: see main). Idempotent.
#
# The one copy of these steps: the DaemonSet's init container runs it from the image
# (/usr/local/bin/ipvsctl-node-prep), and the Vagrant lab runs it on each node.
# Needs root, or CAP_SYS_MODULE (modules) and CAP_NET_ADMIN (net.* sysctls).
#
# Environment:
#   IPVSCTL_PROC_SYS     where the host's /proc/sys is (default /proc/sys). The DaemonSet
#                        mounts the host's /proc/sys/net at /host/proc/sys/net, because a
#                        container's own /proc/sys is read-only.
#   IPVSCTL_MODULES      modules to load, space separated (default: the list below)
#   IPVSCTL_REQUIRED_MODULES  those of them that must end up present (default: ip_vs
#                        nf_conntrack dummy); the others only warn when they cannot load
#   IPVSCTL_STRICT_ARP   1 also sets arp_ignore=1 and arp_announce=2, as kube-proxy's
#                        --ipvs-strict-arp (needed by some layer-2 load balancers)
#   IPVSCTL_KUBE_PROXY_CONFIG  kube-proxy's config.conf (the takeover overlay): strict ARP
#                        too when its ipvs.strictARP is true (the daemon, which parses the
#                        file, checks the sysctls again at start-up)
set -euo pipefail

PROC_SYS="${IPVSCTL_PROC_SYS:-/proc/sys}"
# ip_vs: IPVS itself; ip_vs_*: the schedulers a Service may ask for (ipvsctl.io/scheduler);
# nf_conntrack: connection tracking (IPVS conntrack=1, UDP/SCTP conntrack cleanup);
# dummy: the kube-ipvs0 interface that holds the virtual IPs.
MODULES="${IPVSCTL_MODULES-ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr ip_vs_sh ip_vs_dh ip_vs_sed ip_vs_nq ip_vs_mh nf_conntrack dummy}"
REQUIRED_MODULES="${IPVSCTL_REQUIRED_MODULES-ip_vs nf_conntrack dummy}"

log() { echo "node-prep: $*" >&2; }

# True when a module is loaded or built into the kernel.
module_present() {
	[[ -d "/sys/module/$1" ]] || grep -q "^$1 " /proc/modules 2>/dev/null
}

load_modules() {
	local m
	for m in $MODULES; do
		if module_present "$m"; then
			continue
		fi
		if modprobe "$m" 2>/dev/null; then
			log "loaded module $m"
		else
			log "could not load module $m"
		fi
	done
	for m in $REQUIRED_MODULES; do
		if ! module_present "$m"; then
			log "FATAL: kernel module $m is neither loaded nor loadable (is /lib/modules mounted, and CAP_SYS_MODULE granted?)"
			return 1
		fi
	done
}

# set_sysctl NAME VALUE: writes NAME (dotted) under $PROC_SYS unless it already holds VALUE.
set_sysctl() {
	local path="$PROC_SYS/${1//.//}" current
	if [[ ! -e "$path" ]]; then
		log "FATAL: sysctl $1 does not exist at $path"
		return 1
	fi
	current="$(<"$path")"
	if [[ "$current" == "$2" ]]; then
		return 0
	fi
	if ! echo "$2" >"$path" 2>/dev/null; then
		log "FATAL: cannot set $1=$2 (is $PROC_SYS/net writable, and CAP_NET_ADMIN granted?)"
		return 1
	fi
	log "set $1=$2 (was $current)"
}

# conn_reuse_mode=0 works around slow connection reuse on kernels older than 5.9
# (kubernetes#93297); newer kernels are left as they are, as kube-proxy does.
kernel_older_than_5_9() {
	local release major minor
	release="$(uname -r)"
	major="${release%%.*}"
	minor="${release#*.}"
	minor="${minor%%.*}"
	((major < 5 || (major == 5 && minor < 9)))
}

# IPVSCTL_STRICT_ARP=1, or `strictARP: true` in the ipvs section of kube-proxy's file (an
# indented key: kubeadm, kubespray and `kube-proxy --write-config-to` write it so).
strict_arp_wanted() {
	[[ "${IPVSCTL_STRICT_ARP:-0}" == 1 ]] && return 0
	local file="${IPVSCTL_KUBE_PROXY_CONFIG:-}"
	[[ -n "$file" && -r "$file" ]] || return 1
	grep -Eq '^[[:space:]]+strictARP:[[:space:]]*(true|True|TRUE)[[:space:]]*$' "$file"
}

main() {
	load_modules
	set_sysctl net.ipv4.ip_forward 1
	set_sysctl net.ipv4.vs.conntrack 1
	# 0, where kube-proxy sets 1: the daemon sets 1 around its own deletions only, so a
	# table another program flushes (kube-proxy's start-up cleanup) keeps its connections
	# until the daemon puts it back (docs/netfilter.md, "The hold rules").
	set_sysctl net.ipv4.vs.expire_nodest_conn 0
	# Without it, ClientIP persistence keeps sending clients to a weight-0 real server
	# (kubernetes#71809).
	set_sysctl net.ipv4.vs.expire_quiescent_template 1
	if kernel_older_than_5_9; then
		set_sysctl net.ipv4.vs.conn_reuse_mode 0
	fi
	if strict_arp_wanted; then
		set_sysctl net.ipv4.conf.all.arp_ignore 1
		set_sysctl net.ipv4.conf.all.arp_announce 2
	fi
	log "node ready for ipvsctl"
}

main "$@"
