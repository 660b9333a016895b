#!/usr/bin/env bash
# make image: the ipvsctl image built from Debian's packages and PyPI wheels only (no Docker
# Hub): a Debian 12 root filesystem made with mmdebstrap, ipvsctl and the wheels pinned in
# daemonset/constraints.txt unpacked into it, assembled into an OCI image with umoci.
#
#   daemonset/image/build.sh            # -> out/image/
#
# Output (IMAGE_OUT, default out/image):
#   rootfs/            the image's root filesystem (the smoke test chroots into it, the lab
#                      runs the daemon from it)
#   oci/               OCI image layout, tag ipvsctl:VERSION (IMAGE_TAG)
#   ipvsctl-oci.tar    the same as one file: `skopeo copy oci-archive:ipvsctl-oci.tar:VERSION
#                      docker://REGISTRY/ipvsctl:VERSION`, or `podman load -i ipvsctl-oci.tar`
#   size.txt           the root filesystem's size and the compressed layer's
#   inputs.sha256      what it was built from (below)
#
# Cached (make test runs this every time): nothing is rebuilt when the inputs (this script,
# the constraints, pyproject.toml, LICENSE, node-prep.sh, every file under ipvsctl/) hash
# as in out/image/inputs.sha256; the Debian root filesystem alone is kept in
# out/image-base/ (IMAGE_BASE) for a week, keyed by the package list and mirrors, so an
# ipvsctl change costs the wheels and the packing, not mmdebstrap. IMAGE_REBUILD=1 rebuilds
# everything. The new image replaces out/image only once complete: a failed build leaves
# the previous one (or none), never half a root filesystem.
#
# Needs root (mmdebstrap's root mode, chroot, file owners; re-run through `sudo -n` when
# not root), Debian 12's mmdebstrap and umoci (installed with apt when missing), the
# project venv (make venv) for pip, and network access to deb.debian.org
# (IPVSCTL_DEBIAN_MIRROR, IPVSCTL_DEBIAN_SECURITY) and to the Python package index; each
# download is retried, so a mirror's hiccup costs a minute, not the build. The final image
# has no compiler, pip or setuptools; the wheels are installed from the host without a
# resolver (--no-deps: the constraints file is the whole closure).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${IMAGE_OUT:-out/image}
BASE=${IMAGE_BASE:-out/image-base}
BASE_MAX_DAYS=7
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' ipvsctl/__init__.py)
# The commit `make dist` stamped (release/dist.sh); empty in a checkout.
COMMIT=$(sed -n 's/^__commit__ = "\(.*\)"$/\1/p' ipvsctl/__init__.py)
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

# retry N CMD...: a mirror's hiccup (a reset connection, a 503) is retried, not a failed build
retry() {
	local tries=$1 i
	shift
	for ((i = 1; ; i++)); do
		"$@" && return 0
		if ((i >= tries)); then
			log "failed $i times: $*"
			return 1
		fi
		log "attempt $i failed, again in $((20 * i)) s: $*"
		sleep $((20 * i))
	done
}

if [[ $(id -u) != 0 ]]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		keep=IMAGE_OUT,IMAGE_BASE,IMAGE_TAG,IMAGE_REBUILD,PIP
		exec sudo -n --preserve-env="$keep,IPVSCTL_DEBIAN_MIRROR,IPVSCTL_DEBIAN_SECURITY" \
			bash "$0" "$@"
	fi
	echo "image: needs root (mmdebstrap, chroot, file owners): run as root or with sudo" >&2
	exit 2
fi
if [[ ! -x $PIP ]]; then
	echo "image: no pip at $PIP (run 'make venv' first, or set PIP)" >&2
	exit 2
fi

mkdir -p "$(dirname "$OUT")" "$(dirname "$BASE")"
# One build at a time (two make test runs in one checkout wait for each other).
exec 9>"$OUT.lock"
flock 9

# What the image is made of; the base root filesystem's own key is its mmdebstrap command.
mmdebstrap_args=(--quiet --mode=root --variant=minbase --include="$PACKAGES"
	--aptopt='Acquire::Languages "none"' --aptopt='Acquire::Retries "5"'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-include=/usr/share/doc/*/copyright'
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	"$SUITE")
mirrors=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main"
	"deb $SECURITY $SUITE-security main")
base_key=$(printf '%s\n' "${mmdebstrap_args[@]}" "${mirrors[@]}" | sha256sum | cut -d' ' -f1)
inputs_key=$({
	printf '%s\n' "$base_key" "$TAG"
	find daemonset/image daemonset/constraints.txt daemonset/node-prep.sh pyproject.toml \
		LICENSE ipvsctl -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 |
		LC_ALL=C sort -z | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)

if [[ -z ${IMAGE_REBUILD:-} && -x $OUT/rootfs/usr/local/bin/ipvsctl && -f $OUT/ipvsctl-oci.tar &&
	$(cat "$OUT/inputs.sha256" 2>/dev/null) == "$inputs_key" ]]; then
	log "up to date (inputs unchanged; IMAGE_REBUILD=1 rebuilds): $(cat "$OUT/size.txt")"
	exit 0
fi

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
if ((${#missing[@]})); then
	log "installing ${missing[*]} (apt)"
	export DEBIAN_FRONTEND=noninteractive
	apt_opts=(-qq -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300)
	retry 3 apt-get update "${apt_opts[@]}" </dev/null
	retry 3 apt-get install -y "${apt_opts[@]}" --no-install-recommends "${missing[@]}" </dev/null
fi

start=$(date +%s)
new=$OUT.new
rm -rf "$new"
mkdir -p "$new"
rootfs=$new/rootfs
wheels=$new/wheels

debian_rootfs() { # into $1, from scratch
	rm -rf "$1"
	mmdebstrap "${mmdebstrap_args[@]}" "$1" "${mirrors[@]}"
}

base_age_days=-1
if [[ -f $BASE/key && -d $BASE/rootfs ]]; then
	base_age_days=$((($(date +%s) - $(stat -c %Y "$BASE/key")) / 86400))
fi
if [[ -n ${IMAGE_REBUILD:-} || $(cat "$BASE/key" 2>/dev/null) != "$base_key" ||
	$base_age_days -lt 0 || $base_age_days -ge $BASE_MAX_DAYS ]]; then
	log "debian root filesystem ($SUITE: $PACKAGES)"
	mkdir -p "$BASE"
	if retry 3 debian_rootfs "$BASE/rootfs.new"; then
		rm -rf "$BASE/rootfs.new"/var/cache/apt/* "$BASE/rootfs.new"/var/lib/apt/lists/* \
			"$BASE/rootfs.new"/var/log/*.log "$BASE/rootfs.new"/tmp/*
		rm -rf "$BASE/rootfs" "$BASE/key"
		mv "$BASE/rootfs.new" "$BASE/rootfs"
		echo "$base_key" >"$BASE/key"
	elif [[ -z ${IMAGE_REBUILD:-} && $base_age_days -ge 0 &&
		$(cat "$BASE/key") == "$base_key" ]]; then
		# only too old: offline, last week's packages beat no image
		log "WARNING: no new Debian root filesystem; using the one from $base_age_days days ago"
		rm -rf "$BASE/rootfs.new"
	else
		echo "image: mmdebstrap failed (see above): no Debian root filesystem" >&2
		exit 1
	fi
else
	log "debian root filesystem: cached in $BASE ($base_age_days days old)"
fi
cp -a "$BASE/rootfs" "$rootfs"

have=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ $have != "$PYVER" ]]; then
	echo "image: the root filesystem's python3 is $have, the wheels are for $PYVER" >&2
	exit 1
fi

log "wheels (daemonset/constraints.txt) and ipvsctl"
mkdir -p "$wheels"
# Only the pinned lines; binary wheels for Debian 12's CPython on this machine's arch.
grep -E '^[A-Za-z0-9_.-]+==' daemonset/constraints.txt >"$new/requirements.txt"
retry 3 "$PIP" download --quiet --disable-pip-version-check --retries 5 --no-deps \
	--only-binary=:all: --python-version "$PYVER" --implementation cp --dest "$wheels" \
	--requirement "$new/requirements.txt"
# (setuptools' warnings go to a log, shown only if the build fails; build isolation
# downloads setuptools, hence the retries)
# The wheel is built from a fresh copy of the sources: setuptools' build/ folder in the
# checkout keeps every module it ever copied, so a module deleted since the last build
# (kube/pods.py once) would ship and fail to import.
src=$new/src
mkdir -p "$src"
cp pyproject.toml README.md LICENSE "$src/"
tar --exclude=__pycache__ --exclude='*.pyc' -cf - ipvsctl | tar -C "$src" -xf -
wheel_ipvsctl() {
	"$PIP" wheel --quiet --disable-pip-version-check --retries 5 --no-deps \
		--wheel-dir "$wheels" "$src" >"$new/wheel.log" 2>&1 || {
		cat "$new/wheel.log" >&2
		return 1
	}
}
retry 3 wheel_ipvsctl
rm -rf "$new/wheel.log" "$src"
# kubernetes' asyncio client (kubernetes.aio, 68 MB) and what only it needs are never
# imported by ipvsctl (the smoke test imports every ipvsctl module): left out of the image.
unused='^(aiohttp|aiohttp_retry|aiohappyeyeballs|aiosignal|attrs|frozenlist|multidict|propcache|yarl)-'
find "$wheels" -name '*.whl' -printf '%f\n' | grep -Ev "$unused" | sed "s|^|$wheels/|" \
	>"$new/wheels.txt"
# shellcheck disable=SC2046 # one path per line, no spaces (wheel names)
"$PIP" install --quiet --disable-pip-version-check --no-deps --no-index --no-compile \
	--target "$rootfs$SITE" $(cat "$new/wheels.txt")
rm -rf "${rootfs:?}$SITE/kubernetes/aio"
# pip --target leaves the console scripts pointing at the host's python: ipvsctl gets its own.
rm -rf "${rootfs:?}$SITE/bin"
cat >"$rootfs/usr/local/bin/ipvsctl" <<'EOF'
#!/usr/bin/python3
import sys

from ipvsctl.cli.app import main

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
oci=$new/oci
bundle=$new/bundle
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
	--config.label "org.opencontainers.image.revision=${COMMIT:-unknown}" \
	--config.label "org.opencontainers.image.licenses=Apache-2.0" \
	--config.label "org.opencontainers.image.title=ipvsctl"
umoci gc --layout "$oci"
mv "$bundle/rootfs" "$rootfs"
rm -rf "$bundle" "$wheels" "$new/requirements.txt" "$new/wheels.txt"
tar -C "$oci" -cf "$new/ipvsctl-oci.tar" .

root_mb=$(du -sm "$rootfs" | cut -f1)
layer=$(find "$oci/blobs" -type f -size +1M -printf '%s\n' | sort -n | tail -1)
layer_mb=$(((layer + 524288) / 1048576))
printf 'rootfs %s MB, compressed layer %s MB, built in %s s\n' "$root_mb" "$layer_mb" \
	"$(($(date +%s) - start))" | tee "$new/size.txt" >&2
echo "$inputs_key" >"$new/inputs.sha256"
# Only a complete image takes the place of the previous one.
rm -rf "$OUT.old"
if [[ -e $OUT ]]; then mv "$OUT" "$OUT.old"; fi
mv "$new" "$OUT"
rm -rf "$OUT.old"
log "done: $OUT/oci ($TAG), $OUT/ipvsctl-oci.tar, $OUT/rootfs"
