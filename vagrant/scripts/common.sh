#!/usr/bin/env bash
# Every node: container runtime, kubeadm/kubelet/kubectl, Kubernetes' own prerequisites,
# and ipvsctl's node preparation (daemonset/node-prep.sh, the same script the DaemonSet's
# init container runs). Idempotent.
# Env: NODE_IP (this node's private-network address), K8S_VERSION (e.g. v1.35).
set -euo pipefail
: "${NODE_IP:?}" "${K8S_VERSION:?}"
export DEBIAN_FRONTEND=noninteractive

# kubelet refuses to run with swap on.
swapoff -a
sed -i '/\sswap\s/s/^\([^#]\)/#\1/' /etc/fstab

apt-get update -qq
apt-get install -y -qq --no-install-recommends \
	apt-transport-https ca-certificates curl gpg \
	containerd podman \
	conntrack ipset iptables ipvsadm kmod socat jq

# Kubernetes' prerequisites (not ipvsctl's): overlay for containerd, br_netfilter so that
# bridged pod traffic passes the IP hooks (IPVS replies between pods on one node).
cat >/etc/modules-load.d/kubernetes.conf <<'CONF'
overlay
br_netfilter
CONF
modprobe overlay
modprobe br_netfilter
cat >/etc/sysctl.d/90-kubernetes.conf <<'CONF'
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
CONF
sysctl --system >/dev/null

# ipvsctl: modules and sysctls (the DaemonSet's init container repeats this at each start).
/ipvsctl/daemonset/node-prep.sh
# Load the IPVS modules at boot as well, for anything that starts before ipvsctl's pod.
cat >/etc/modules-load.d/ipvsctl.conf <<'CONF'
ip_vs
ip_vs_rr
ip_vs_wrr
ip_vs_lc
ip_vs_wlc
ip_vs_sh
nf_conntrack
dummy
CONF

# containerd with the systemd cgroup driver, as kubeadm's kubelet expects.
mkdir -p /etc/containerd
if ! grep -q 'SystemdCgroup = true' /etc/containerd/config.toml 2>/dev/null; then
	containerd config default >/etc/containerd/config.toml
	sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml
	systemctl restart containerd
fi
systemctl enable --now containerd

# kubeadm, kubelet, kubectl from the Kubernetes package repository.
if [[ ! -f /etc/apt/sources.list.d/kubernetes.list ]]; then
	mkdir -p /etc/apt/keyrings
	curl -fsSL "https://pkgs.k8s.io/core:/stable:/${K8S_VERSION}/deb/Release.key" |
		gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes-apt-keyring.gpg
	echo "deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/${K8S_VERSION}/deb/ /" \
		>/etc/apt/sources.list.d/kubernetes.list
	apt-get update -qq
fi
apt-get install -y -qq kubelet kubeadm kubectl kubernetes-cni
apt-mark hold kubelet kubeadm kubectl >/dev/null

# The private-network address, not the NAT address every Vagrant VM shares.
echo "KUBELET_EXTRA_ARGS=--node-ip=${NODE_IP}" >/etc/default/kubelet
systemctl enable kubelet
systemctl restart kubelet
