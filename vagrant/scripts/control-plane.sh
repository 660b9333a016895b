#!/usr/bin/env bash
# The control-plane node: kubeadm init without kube-proxy, kube-router as CNI with its
# service proxy off, then ipvsctl (vagrant/overlay: daemonset/ with the lab's API server
# address and the locally built image). Idempotent.
# Env: NODE_IP, POD_CIDR, KUBEADM_TOKEN, KUBE_ROUTER_VERSION.
set -euo pipefail
: "${NODE_IP:?}" "${POD_CIDR:?}" "${KUBEADM_TOKEN:?}" "${KUBE_ROUTER_VERSION:?}"
LAB=/ipvsctl/vagrant
export KUBECONFIG=/etc/kubernetes/admin.conf

# ipvsctl reaches the API server at this address (it must not use the kubernetes Service's
# ClusterIP, which it programs itself); the overlay has to agree with the Vagrantfile.
if ! grep -qF "IPVSCTL_APISERVER=https://${NODE_IP}:6443" "$LAB/overlay/kustomization.yaml"; then
	echo "control-plane.sh: vagrant/overlay/kustomization.yaml does not name https://${NODE_IP}:6443" >&2
	exit 1
fi

if [[ ! -f /etc/kubernetes/admin.conf ]]; then
	kubeadm init \
		--apiserver-advertise-address="$NODE_IP" \
		--pod-network-cidr="$POD_CIDR" \
		--token="$KUBEADM_TOKEN" \
		--token-ttl=0 \
		--node-name="$(hostname)" \
		--skip-phases=addon/kube-proxy
fi

for home in /root /home/vagrant; do
	mkdir -p "$home/.kube"
	cp /etc/kubernetes/admin.conf "$home/.kube/config"
done
chown -R vagrant:vagrant /home/vagrant/.kube

# A two-node lab: let workloads run on the control plane too.
kubectl taint nodes "$(hostname)" node-role.kubernetes.io/control-plane:NoSchedule- 2>/dev/null || true

# kube-router: pod routing (BGP) and network policy; IPVS is left to ipvsctl.
sed -e "s|__KUBE_ROUTER_VERSION__|${KUBE_ROUTER_VERSION}|g" \
	-e "s|__APISERVER_HOST__|${NODE_IP}|g" \
	"$LAB/manifests/kube-router.yaml" | kubectl apply -f -

# ipvsctl.
kubectl apply -k "$LAB/overlay"
kubectl -n kube-system rollout status daemonset/kube-router --timeout=10m
kubectl -n ipvsctl-system rollout status daemonset/ipvsctl --timeout=10m
# CoreDNS reaches the API through the kubernetes Service: ready once ipvsctl programs it.
kubectl -n kube-system rollout status deployment/coredns --timeout=10m
kubectl get nodes -o wide
