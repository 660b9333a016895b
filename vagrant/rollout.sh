#!/usr/bin/env bash
# Graceful-termination check on the Vagrant lab: deploys a 3-replica HTTP app behind a
# ClusterIP (manifests/rollout-app.yaml), runs steady load through the ClusterIP from a
# busybox pod (scripts/loadgen.sh: a new TCP connection per request), does
# `kubectl rollout restart` ROUNDS times, and reports requests sent and failed, with
# ipvsctl's view of the drains.
#
#   vagrant ssh cp -c 'sudo /ipvsctl/vagrant/rollout.sh'
#
# Env: ROUNDS (3), SETTLE seconds between rounds (15), ALLOWED_FAILURES (0),
#      LOADGEN_IMAGE (docker.io/library/busybox:1.36), KUBECONFIG (admin.conf).
# Exit status: 0 when failed <= ALLOWED_FAILURES, 1 otherwise, 2 when the check could not run.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
NS=ipvsctl-rollout
ROUNDS="${ROUNDS:-3}"
SETTLE="${SETTLE:-15}"
ALLOWED_FAILURES="${ALLOWED_FAILURES:-0}"
LOADGEN_IMAGE="${LOADGEN_IMAGE:-docker.io/library/busybox:1.36}"
export KUBECONFIG="${KUBECONFIG:-/etc/kubernetes/admin.conf}"

log() { echo "rollout: $*" >&2; }
die() {
	log "$*"
	exit 2
}

kubectl version >/dev/null || die "no cluster reachable with KUBECONFIG=$KUBECONFIG"
kubectl -n ipvsctl-system rollout status daemonset/ipvsctl --timeout=5m >/dev/null ||
	die "ipvsctl is not ready on every node"

log "deploying the app"
kubectl apply -f "$HERE/manifests/rollout-app.yaml" >/dev/null
kubectl -n "$NS" rollout status deployment/web --timeout=5m >/dev/null
cluster_ip="$(kubectl -n "$NS" get service web -o jsonpath='{.spec.clusterIP}')"
[[ -n "$cluster_ip" ]] || die "service web has no ClusterIP"

log "starting load against http://$cluster_ip/"
kubectl -n "$NS" create configmap loadgen --from-file=loadgen.sh="$HERE/scripts/loadgen.sh" \
	--dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS" delete pod loadgen --ignore-not-found --wait >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: loadgen
  namespace: $NS
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
    - name: loadgen
      image: $LOADGEN_IMAGE
      command: ["sh", "/loadgen/loadgen.sh"]
      env:
        - name: URL
          value: "http://$cluster_ip/"
      volumeMounts:
        - name: script
          mountPath: /loadgen
  volumes:
    - name: script
      configMap:
        name: loadgen
EOF
kubectl -n "$NS" wait pod/loadgen --for=condition=Ready --timeout=3m >/dev/null
sleep "$SETTLE"

for round in $(seq 1 "$ROUNDS"); do
	log "round $round/$ROUNDS: kubectl rollout restart deployment/web"
	kubectl -n "$NS" rollout restart deployment/web >/dev/null
	kubectl -n "$NS" rollout status deployment/web --timeout=5m >/dev/null
	sleep "$SETTLE"
done

log "stopping load"
kubectl -n "$NS" exec loadgen -- touch /tmp/stop
kubectl -n "$NS" wait pod/loadgen --for=jsonpath='{.status.phase}'=Succeeded --timeout=2m >/dev/null
logs="$(kubectl -n "$NS" logs loadgen)"
summary="$(grep -E '^loadgen: sent=[0-9]+ failed=[0-9]+$' <<<"$logs" | tail -1)" ||
	die "no summary from the load generator"
sent="$(sed -E 's/.*sent=([0-9]+).*/\1/' <<<"$summary")"
failed="$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")"

echo
echo "== failed requests (first 20)"
grep '^loadgen: FAIL' <<<"$logs" | head -20 || echo "(none)"
echo
echo "== ipvsctl drains, per node"
for node_ip in $(kubectl get nodes -o jsonpath='{.items[*].status.addresses[?(@.type=="InternalIP")].address}'); do
	echo "-- $node_ip"
	curl -sf "http://$node_ip:9796/metrics" | grep -E '^ipvsctl_(real_server_deletions_total|drain_queue_length)' ||
		echo "(metrics not reachable)"
done
echo
echo "== ipvsctl status (one node)"
kubectl -n ipvsctl-system exec daemonset/ipvsctl -c ipvsctl -- ipvsctl status || true
echo
echo "rollout: rounds=$ROUNDS sent=$sent failed=$failed"

if ((failed > ALLOWED_FAILURES)); then
	exit 1
fi
