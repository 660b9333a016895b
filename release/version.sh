#!/usr/bin/env bash
# release/version.sh [DIR]: the version of the git checkout DIR (default: this repository),
# from its tags, as `make dist` stamps it on the wheel, the sdist and the image:
#   HEAD at tag vX.Y.Z             X.Y.Z                (a release)
#   N commits after tag vX.Y.Z     X.Y.Z.postN+gSHA     (a build between releases)
#   no tag v* at all               V+gSHA               (V: ipvsctl/__init__.py's __version__)
# A tag must be a plain PEP 440 release (1.2.3, 1.2.3rc1; v first): any other v* tag on
# HEAD's history stops it (exit 2), rather than stamping a version pip would rewrite.
set -euo pipefail

dir=${1:-$(dirname "$0")/..}
if ! sha=$(git -C "$dir" rev-parse --short=7 HEAD 2>/dev/null); then
	echo "version: $dir is not a git checkout" >&2
	exit 2
fi
if describe=$(git -C "$dir" describe --tags --match 'v[0-9]*' --long --abbrev=7 2>/dev/null); then
	tag=${describe%-*-g*} # vX.Y.Z-N-gSHA: the tag may itself hold dashes
	rest=${describe#"$tag"-}
	commits=${rest%%-*}
	sha=${rest#*-g}
	version=${tag#v}
	if [[ ! $version =~ ^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?$ ]]; then
		echo "version: tag $tag is not a release version (vX.Y.Z, vX.Y.ZrcN)" >&2
		exit 2
	fi
	if [[ $commits != 0 ]]; then
		version+=".post$commits+g$sha"
	fi
else
	version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$dir/ipvsctl/__init__.py")
	if [[ -z $version ]]; then
		echo "version: no __version__ line in $dir/ipvsctl/__init__.py" >&2
		exit 2
	fi
	version+="+g$sha"
fi
echo "$version"
