#!/usr/bin/env bash
# make dist: a release's files, built from the commit checked out (HEAD), never from
# uncommitted changes, with the version of its git tag (release/version.sh):
#
#   out/dist/ (DIST_OUT)
#     ipvsctl-VERSION-py3-none-any.whl   pip install it (or the sdist)
#     ipvsctl-VERSION.tar.gz             the sdist
#     ipvsctl-TAG-oci.tar                the image as an OCI archive, tagged TAG (VERSION with
#                                        + as -): `skopeo copy oci-archive:FILE:TAG
#                                        docker://REGISTRY/ipvsctl:TAG` (docs/install.md)
#     SHA256SUMS                         `sha256sum -c SHA256SUMS` checks the three
#
# The three are built from one copy of HEAD (git archive) whose ipvsctl/__init__.py gets the
# version and the commit, so `ipvsctl version` names both, in the wheel and in the image. A
# release (HEAD at tag vX.Y.Z) must have its section, `## X.Y.Z`, in CHANGELOG.md: without it
# this stops (exit 2) before building anything.
#
# Needs the venv (make venv; `build` is installed into it when missing, and builds in
# isolation: PyPI), and for the image what daemonset/image/build.sh needs (root, mmdebstrap,
# umoci, Debian's mirrors); its Debian root filesystem cache is out/image-base/ (IMAGE_BASE).
# DIST_IMAGE=0 builds the wheel and the sdist only.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
out=${DIST_OUT:-out/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PY:-$repo/.venv/bin/python}

log() { echo "dist: $*" >&2; }

version=$(release/version.sh "$repo")
commit=$(git rev-parse HEAD)
tag=${version//+/-}
# (grep reads all of it: with -q it could stop early, and pipefail would take git's SIGPIPE)
if [[ $version != *+* ]] && ! git show HEAD:CHANGELOG.md | grep -x "## $version\( .*\)\{0,1\}" >/dev/null; then
	echo "dist: release $version has no section \"## $version\" in CHANGELOG.md at HEAD" \
		"(move what is under Unreleased there, commit, tag again)" >&2
	exit 2
fi
if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
	log "note: uncommitted changes are not in it (built from HEAD, $commit)"
fi
if [[ ! -x $py ]]; then
	echo "dist: no $py (run 'make venv' first, or set PY)" >&2
	exit 2
fi
log "ipvsctl $version ($commit)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/ipvsctl-$version
mkdir "$src"
git archive HEAD | tar -x -C "$src"
init=$src/ipvsctl/__init__.py
sed -i -e "s/^__version__ = \".*\"\$/__version__ = \"$version\"/" \
	-e "s/^__commit__ = \".*\"\$/__commit__ = \"$commit\"/" "$init"
if ! grep -qx "__version__ = \"$version\"" "$init" || ! grep -qx "__commit__ = \"$commit\"" "$init"; then
	echo "dist: could not stamp the version and commit into ipvsctl/__init__.py" >&2
	exit 1
fi

rm -f "$out"/ipvsctl-* "$out/SHA256SUMS"
"$py" -c 'import build' 2>/dev/null || "$py" -m pip install -q build </dev/null
log "wheel and sdist"
if ! (cd "$src" && "$py" -m build --sdist --wheel --outdir "$out" >"$work/build.log" 2>&1); then
	cat "$work/build.log" >&2
	exit 1
fi

if [[ ${DIST_IMAGE:-1} != 0 ]]; then
	log "image ipvsctl:$tag"
	IMAGE_OUT=$work/image IMAGE_TAG=$tag IMAGE_BASE=${IMAGE_BASE:-$repo/out/image-base} \
		PIP=${PIP:-$repo/.venv/bin/pip} bash "$src/daemonset/image/build.sh"
	cp "$work/image/ipvsctl-oci.tar" "$out/ipvsctl-$tag-oci.tar"
fi

(cd "$out" && sha256sum -- ipvsctl-* >SHA256SUMS)
log "done: $out"
sed 's/^/  /' "$out/SHA256SUMS" >&2
