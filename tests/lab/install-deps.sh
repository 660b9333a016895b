#!/usr/bin/env bash
# What the lab VM (tests/lab/boot.py) needs from the system: qemu, a Debian kernel with IPVS
# modules, and the witness tools run inside the guest. Installs only what is missing, so it
# is cheap to run every time. For Debian 12 as root (or with passwordless sudo); needs no
# terminal and no stdin (CI=true).
set -euo pipefail

packages=(qemu-system-x86 linux-image-amd64 ipvsadm conntrack nftables iproute2 busybox-static)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "lab-deps: all installed (${packages[*]})"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo -n)
fi

echo "lab-deps: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  --no-install-recommends "${missing[@]}" </dev/null
