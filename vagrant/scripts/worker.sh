#!/usr/bin/env bash
# A worker node: joins the cluster (the lab's bootstrap token; CA pinning is skipped, which
# is acceptable for a throwaway lab only). Idempotent.
# Env: CP_IP, KUBEADM_TOKEN.
set -euo pipefail
: "${CP_IP:?}" "${KUBEADM_TOKEN:?}"

if [[ ! -f /etc/kubernetes/kubelet.conf ]]; then
	for _ in $(seq 1 120); do
		if curl -ksf "https://${CP_IP}:6443/readyz" >/dev/null; then
			break
		fi
		sleep 5
	done
	kubeadm join "${CP_IP}:6443" \
		--token="$KUBEADM_TOKEN" \
		--discovery-token-unsafe-skip-ca-verification \
		--node-name="$(hostname)"
fi
