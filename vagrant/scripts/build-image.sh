#!/usr/bin/env bash
# Builds the ipvsctl image from the synced repository (/ipvsctl) with podman and loads it
# into containerd's k8s.io namespace, where the kubelet finds it (imagePullPolicy
# IfNotPresent, image localhost/ipvsctl:dev as set in vagrant/overlay/).
set -euo pipefail
IMAGE="${IMAGE:-localhost/ipvsctl:dev}"
archive="$(mktemp /tmp/ipvsctl-image.XXXXXX.tar)"
trap 'rm -f "$archive"' EXIT

podman build --pull=missing -f /ipvsctl/daemonset/Dockerfile -t "$IMAGE" /ipvsctl
rm -f "$archive"
podman save --format docker-archive -o "$archive" "$IMAGE"
ctr --namespace k8s.io images import "$archive"
ctr --namespace k8s.io images ls -q | grep -Fx "$IMAGE"
