#!/usr/bin/env bash
# make image: the ipvsctl image built from Debian's packages and PyPI wheels only (no Docker
# Hub): a Debian 12 root filesystem made with mmdebstrap, ipvsctl and the wheels pinned in
# daemonset/constraints.txt unpacked into it, assembled into an OCI image with umoci.
#
#   daemonset/image/build.sh            # -> out/image/
#
# Output (IMAGE_OUT, default out/image):
#   rootfs/            the image's root filesystem (the smoke test chroots into it)
#   oci/               OCI image layout, tag ipvsctl:VERSION (IMAGE_TAG)
#   ipvsctl-oci.tar    the same as one file: `skopeo copy oci-archive:ipvsctl-oci.tar:VERSION
#                      docker://REGISTRY/ipvsctl:VERSION`, or `podman load -i ipvsctl-oci.tar`
#   size.txt           the root filesystem's size and the compressed layer's
#
# Needs root (mmdebstrap's root mode, chroot, file owners), Debian 12's mmdebstrap and umoci
# (installed when missing), the project venv (make venv) for pip, and network access to
# deb.debian.org (IPVSCTL_DEBIAN_MIRROR, IPVSCTL_DEBIAN_SECURITY) and to the Python package
# index. The final image has no compiler, pip or setuptools; the wheels are installed from
# the host without a resolver (--no-deps: the constraints file is the whole closure).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${IMAGE_OUT:-out/image}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' ipvsctl/__init__.py)
TAG=${IMAGE_TAG:-$VERSION}
SUITE=bookworm
MIRROR=${IPVSCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${IPVSCTL_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
PIP=${PIP:-.venv/bin/pip}
PYVER=3.11 # Debian 12's python3; the wheels must be for it
SITE=/usr/local/lib/python$PYVER/dist-packages
# conntrack, ipvsadm, nft, ip: debugging on the node; kmod: modprobe for node-prep.sh
PACKAGES=python3,ca-certificates,conntrack,iproute2,ipvsadm,kmod,nftables

log() { echo "image: $*" >&2; }

if [[ $(id -u) != 0 ]]; then
	echo "image: needs root (mmdebstrap, chroot, file owners)" >&2
	exit 2
fi
if [[ ! -x $PIP ]]; then
	echo "image: no pip at $PIP (run 'make venv' first, or set PIP)" >&2
	exit 2
fi
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
if ((${#missing[@]})); then
	log "installing ${missing[*]} (apt)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi

start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT"
rootfs=$OUT/rootfs
wheels=$OUT/wheels

log "debian root filesystem ($SUITE: $PACKAGES)"
mmdebstrap --quiet --mode=root --variant=minbase --include="$PACKAGES" \
	--aptopt='Acquire::Languages "none"' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	"$SUITE" "$rootfs" \
	"deb $MIRROR $SUITE main" \
	"deb $MIRROR $SUITE-updates main" \
	"deb $SECURITY $SUITE-security main"

have=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ $have != "$PYVER" ]]; then
	echo "image: the root filesystem's python3 is $have, the wheels are for $PYVER" >&2
	exit 1
fi

log "wheels (daemonset/constraints.txt) and ipvsctl"
mkdir -p "$wheels"
# Only the pinned lines; binary wheels for Debian 12's CPython on this machine's arch.
grep -E '^[A-Za-z0-9_.-]+==' daemonset/constraints.txt >"$OUT/requirements.txt"
"$PIP" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	--python-version "$PYVER" --implementation cp --dest "$wheels" \
	--requirement "$OUT/requirements.txt"
# (setuptools' warnings go to a log, shown only if the build fails)
if ! "$PIP" wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$wheels" . \
	>"$OUT/wheel.log" 2>&1; then
	cat "$OUT/wheel.log" >&2
	exit 1
fi
rm -f "$OUT/wheel.log"
# kubernetes' asyncio client (kubernetes.aio, 68 MB) and what only it needs are never
# imported by ipvsctl (the smoke test imports every ipvsctl module): left out of the image.
unused='^(aiohttp|aiohttp_retry|aiohappyeyeballs|aiosignal|attrs|frozenlist|multidict|propcache|yarl)-'
find "$wheels" -name '*.whl' -printf '%f\n' | grep -Ev "$unused" | sed "s|^|$wheels/|" \
	>"$OUT/wheels.txt"
# shellcheck disable=SC2046 # one path per line, no spaces (wheel names)
"$PIP" install --quiet --disable-pip-version-check --no-deps --no-index --no-compile \
	--target "$rootfs$SITE" $(cat "$OUT/wheels.txt")
rm -rf "${rootfs:?}$SITE/kubernetes/aio"
# pip --target leaves the console scripts pointing at the host's python: ipvsctl gets its own.
rm -rf "${rootfs:?}$SITE/bin"
cat >"$rootfs/usr/local/bin/ipvsctl" <<'EOF'
#!/usr/bin/python3
import sys

from ipvsctl.shell.cli import main

sys.exit(main())
EOF
chmod 0755 "$rootfs/usr/local/bin/ipvsctl"
# The root filesystem is read-only in the pod: compile now, never at run time.
chroot "$rootfs" python3 -m compileall -q -j 0 "$SITE" >/dev/null

install -m 0755 daemonset/node-prep.sh "$rootfs/usr/local/bin/ipvsctl-node-prep"
install -D -m 0644 LICENSE "$rootfs/usr/share/doc/ipvsctl/copyright"
# The image's default user, as the Dockerfile's (the DaemonSet runs as uid 0).
echo "ipvsctl:x:10001:10001::/nonexistent:/usr/sbin/nologin" >>"$rootfs/etc/passwd"
echo "ipvsctl:x:10001:" >>"$rootfs/etc/group"
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
	"$rootfs"/tmp/* "$rootfs"/root/.cache
# Reproducible-ish: mmdebstrap writes the machine-id empty; keep it so.

log "OCI image ipvsctl:$TAG (umoci)"
oci=$OUT/oci
bundle=$OUT/bundle
umoci init --layout "$oci"
umoci new --image "$oci:$TAG"
umoci unpack --image "$oci:$TAG" "$bundle" >/dev/null
rmdir "$bundle/rootfs"
mv "$rootfs" "$bundle/rootfs"
umoci repack --image "$oci:$TAG" "$bundle"
umoci config --image "$oci:$TAG" --os linux --architecture "$(dpkg --print-architecture)" \
	--author "ipvsctl" --config.user 10001 \
	--config.entrypoint ipvsctl --config.cmd run \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
	--config.label "org.opencontainers.image.version=$VERSION" \
	--config.label "org.opencontainers.image.licenses=Apache-2.0" \
	--config.label "org.opencontainers.image.title=ipvsctl"
umoci gc --layout "$oci"
mv "$bundle/rootfs" "$rootfs"
rm -rf "$bundle" "$wheels" "$OUT/requirements.txt" "$OUT/wheels.txt"
tar -C "$oci" -cf "$OUT/ipvsctl-oci.tar" .

root_mb=$(du -sm "$rootfs" | cut -f1)
layer=$(find "$oci/blobs" -type f -size +1M -printf '%s\n' | sort -n | tail -1)
layer_mb=$(((layer + 524288) / 1048576))
printf 'rootfs %s MB, compressed layer %s MB, built in %s s\n' "$root_mb" "$layer_mb" \
	"$(($(date +%s) - start))" | tee "$OUT/size.txt" >&2
log "done: $OUT/oci ($TAG), $OUT/ipvsctl-oci.tar, $OUT/rootfs"
