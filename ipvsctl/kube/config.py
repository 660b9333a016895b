"""Where the API server is and how to authenticate: kubeconfig, in-cluster service account,
and the `--apiserver` override. Every failure becomes one SourceConfigError line.

Every file this reads (the kubeconfig, the token, CA, client certificate and key it or the
in-cluster configuration names) is checked first by `kube.files.read_bounded`: a regular
file, opened non-blocking, within a size; a FIFO or `/dev/zero` named by mistake is one
line and exit 1, not a hung start-up or a node out of memory. The CA is then handed to the
client as data, so no connection reads its file again; the token is re-read (it rotates)
the same bounded way."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client as k8s_client
from kubernetes.config import kube_config
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_PORT_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    _join_host_port,
)
from urllib3.connection import HTTPConnection

from ipvsctl.kube.files import (
    CA_LIMIT,
    CERT_LIMIT,
    KUBECONFIG_LIMIT,
    TOKEN_LIMIT,
    FileRefused,
    read_bounded,
    read_token,
)
from ipvsctl.kube.logs import LOGGER, log
from ipvsctl.obs.logging import FailureStreaks
from ipvsctl.source.events import SourceConfigError

IN_CLUSTER_HOST_ENV = "KUBERNETES_SERVICE_HOST"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _check_apiserver(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceConfigError(
            f"invalid API server URL {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]"
        )
    return url.rstrip("/")


def host_addresses(url: str) -> frozenset[str]:
    """The API server's addresses, from its URL: resolved once (a node proxy must not let a
    Service take them, CONTRACT "Node safety"; a hostname that later resolves elsewhere is
    not followed). Empty, with one warning line, when the name does not resolve now."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        log(logging.WARNING, "API server name not resolved", host=host, error=_one_line(exc))
        return frozenset()
    out = set()
    for info in infos:
        address = str(info[4][0])
        if "%" not in address:
            out.add(socket.inet_ntop(info[0], socket.inet_pton(info[0], address)))
    return frozenset(out)


def _keepalive_options() -> list[tuple[int, int, int]]:
    """TCP keepalive, so a peer that vanished is noticed even between watch events (the read
    timeout catches a peer that is alive but silent)."""
    opts = list(HTTPConnection.default_socket_options)
    opts.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return opts


def _pin_host(cfg: k8s_client.Configuration, host: str) -> None:
    """Use `host` for every request (the loader's hook must not rewrite it: see
    `_credentials_only`)."""
    cfg.host = host
    _credentials_only(cfg)


def _credentials_only(cfg: k8s_client.Configuration) -> None:
    """The kubeconfig loader installs a token refresh hook, run before every request, that
    writes everything it loaded back onto the configuration (`host`, the CA's path, ...).
    Run it against a scratch object that shares only the credentials: the host may be
    pinned (`--apiserver`), the CA is handed over as data (`_ca_as_data`), and another
    thread must never see either change, even for a moment. (What else it sets is read
    only when an ApiClient is made, never by one that exists.)"""
    hook = cfg.refresh_api_key_hook
    if hook is None:
        return

    def refresh(_: Any) -> None:
        hook(SimpleNamespace(api_key=cfg.api_key, api_key_prefix=cfg.api_key_prefix))

    cfg.refresh_api_key_hook = refresh


TOKEN_REREAD_SECONDS = 60.0  # as client-go's cached token source for a tokenFile


def _token_file(loader: Any) -> str | None:
    """The `tokenFile` the kubeconfig's user authenticates with, if that is how (kubeadm's
    kube-proxy kubeconfig: the pod's projected service-account token)."""
    user = getattr(loader, "_user", None)
    if not user or "token" in user or "tokenFile" not in user:
        return None
    if "auth-provider" in user or "exec" in user:
        return None
    file = str(user["tokenFile"])
    if not os.path.isabs(file):
        file = os.path.join(loader._get_base_path(user.path), file)
    return file


# The files a context names, as the client's loader reads them: (section, key, the key that
# carries the same inline (then no file is read), size bound, read only for an https server)
_NAMED_FILES = (
    ("user", "tokenFile", "token", TOKEN_LIMIT, False),
    ("user", "client-certificate", "client-certificate-data", CERT_LIMIT, True),
    ("user", "client-key", "client-key-data", CERT_LIMIT, True),
    ("cluster", "certificate-authority", "certificate-authority-data", CA_LIMIT, True),
)


def _check_named_files(loader: Any, path: str) -> None:
    """Before the client's loader opens them (unbounded, blocking): every file the current
    context's user and cluster name, as the loader would resolve it (relative to its
    kubeconfig's folder). SourceConfigError naming the first that cannot be used."""
    nodes = {
        section: node
        for section in ("user", "cluster")
        if isinstance(node := getattr(loader, f"_{section}", None), kube_config.ConfigNode)
        and isinstance(node.value, dict)
    }
    server = nodes["cluster"].safe_get("server") if "cluster" in nodes else None
    https = isinstance(server, str) and server.startswith("https")
    for section, key, inline, limit, tls_only in _NAMED_FILES:
        node = nodes.get(section)
        if node is None:
            continue
        name = node.safe_get(key)
        if name is None or node.safe_get(inline) or (tls_only and not https):
            continue
        file = os.path.normpath(os.path.join(loader._get_base_path(node.path), str(name)))
        try:
            read_bounded(file, limit)
        except FileRefused as exc:
            raise SourceConfigError(f"invalid kubeconfig {path}: {key} {file}: {exc}") from None


def _ca_as_data(cfg: k8s_client.Configuration, what: str) -> None:
    """Hand the client the CA's contents, read once here, instead of its path: urllib3
    would have OpenSSL open the file again for every new connection, unbounded and blocking
    (a FIFO there would hang a watch's reconnect). PEM as text, anything else as bytes
    (DER), as OpenSSL takes them."""
    if not cfg.ssl_ca_cert:
        return
    try:
        data = read_bounded(cfg.ssl_ca_cert, CA_LIMIT)
    except FileRefused as exc:
        raise SourceConfigError(f"{what} certificate-authority {cfg.ssl_ca_cert}: {exc}") from None
    try:
        cfg.ca_cert_data = data.decode("ascii")
    except UnicodeDecodeError:
        cfg.ca_cert_data = data
    cfg.ssl_ca_cert = None


def _reread_token(
    cfg: k8s_client.Configuration,
    token_file: str,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Re-read a token file at most once a minute, as client-go does: the kubelet rotates
    projected service-account tokens, and the Python client reads the file once. The read
    is bounded and never blocks (it runs before every request, on the watches' threads); a
    failed one keeps the token it has (the API server's answer says if it expired), logged
    once per streak."""
    read_at = clock()
    streak = FailureStreaks(LOGGER)

    def refresh(c: Any) -> None:
        nonlocal read_at
        if clock() - read_at < TOKEN_REREAD_SECONDS:
            return
        read_at = clock()
        try:
            token = read_token(token_file)
        except FileRefused as exc:
            streak.failed(
                logging.WARNING,
                "token file unreadable, keeping the token",
                file=token_file,
                error=str(exc),
            )
            return
        streak.recovered("token file readable again", file=token_file)
        c.api_key["BearerToken"] = f"Bearer {token}"

    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed None in the client


def _in_cluster(
    cfg: k8s_client.Configuration, env: Mapping[str, str], token_file: str, ca_file: str
) -> None:
    """The pod's service account, as the client's InClusterConfigLoader and client-go's
    rest.InClusterConfig read it, with the token and CA read bounded (that loader opens
    them unbounded and blocking, at start-up and on every re-read)."""
    host, port = env.get(IN_CLUSTER_HOST_ENV), env.get(SERVICE_PORT_ENV_NAME)
    if not host or not port:
        raise SourceConfigError(
            f"in-cluster API config: {IN_CLUSTER_HOST_ENV} and {SERVICE_PORT_ENV_NAME} "
            "must both be set"
        )
    try:
        token = read_token(token_file)
    except FileRefused as exc:
        raise SourceConfigError(f"in-cluster API config: token {token_file}: {exc}") from None
    try:
        ca = read_bounded(ca_file, CA_LIMIT)
    except FileRefused as exc:
        raise SourceConfigError(f"in-cluster API config: CA {ca_file}: {exc}") from None
    if not ca.strip():
        raise SourceConfigError(f"in-cluster API config: CA {ca_file}: empty")
    cfg.host = "https://" + _join_host_port(host, port)
    cfg.api_key["BearerToken"] = f"Bearer {token}"
    cfg.ssl_ca_cert = ca_file
    _ca_as_data(cfg, "in-cluster API config:")
    _reread_token(cfg, token_file)


def load_configuration(
    kubeconfig: str | None,
    apiserver: str | None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    token_file: str = SERVICE_TOKEN_FILENAME,
    ca_file: str = SERVICE_CERT_FILENAME,
    proxy: bool = True,
) -> k8s_client.Configuration:
    """Build the client configuration. Order: `kubeconfig` (else $KUBECONFIG), else the
    in-cluster service account, else (only with `apiserver`) no credentials at all; then
    `apiserver` replaces the server URL. Raises SourceConfigError with one clear line.
    `proxy`: the caller is the proxy (warned off the in-cluster ClusterIP address); the
    shutdown-manager, an application pod's sidecar, is not."""
    env = os.environ if environ is None else environ
    if apiserver is not None:
        apiserver = _check_apiserver(apiserver)
    path = kubeconfig or env.get("KUBECONFIG") or None
    cfg = k8s_client.Configuration()
    if path:
        # KUBECONFIG may list several files; as kubectl, tolerate missing ones but not all.
        # The loader reads every one that exists: each must be a file it can read whole.
        problems = []
        found = False
        for file in [p for p in path.split(os.pathsep) if p]:
            try:
                read_bounded(os.path.expanduser(file), KUBECONFIG_LIMIT)
            except FileRefused as exc:
                if not exc.missing:
                    raise SourceConfigError(f"cannot read kubeconfig {file}: {exc}") from None
                problems.append(f"cannot read kubeconfig {file}: {exc}")
            else:
                found = True
        if not found:
            raise SourceConfigError(problems[0] if problems else "empty kubeconfig path")
        try:
            # load_kube_config's own steps, keeping the loader to see its user's tokenFile
            loader = kube_config._get_kube_config_loader(
                filename=path,
                active_context=context,
                persist_config=False,  # never write to the user's kubeconfig
            )
            _check_named_files(loader, path)
            loader.load_and_set(cfg)
        except SourceConfigError:
            raise
        except Exception as exc:
            raise SourceConfigError(f"invalid kubeconfig {path}: {_one_line(exc)}") from None
        _credentials_only(cfg)
        _ca_as_data(cfg, f"invalid kubeconfig {path}:")
        user_token_file = _token_file(loader)
        if user_token_file:
            _reread_token(cfg, user_token_file)
        source = "kubeconfig"
    elif env.get(IN_CLUSTER_HOST_ENV):
        _in_cluster(cfg, env, token_file, ca_file)
        source = "in-cluster"
        if apiserver is None and proxy:
            log(
                logging.WARNING,
                "using the in-cluster API address, a ClusterIP this proxy programs itself; "
                "pass --apiserver",
                host=cfg.host,
            )
    elif apiserver is not None:
        source = "none"  # e.g. a local test server over plain http
    else:
        raise SourceConfigError(
            "no Kubernetes API configuration: pass --kubeconfig (or set KUBECONFIG), or run "
            f"in a pod ({IN_CLUSTER_HOST_ENV} is not set)"
        )
    if apiserver is not None:
        _pin_host(cfg, apiserver)
    if not cfg.host:
        raise SourceConfigError(
            f"invalid kubeconfig {path}: the current context's cluster has no server URL"
            if source == "kubeconfig"
            else f"no API server URL in the {source} configuration"
        )
    cfg.socket_options = _keepalive_options()
    # No silent retries inside urllib3: the reflectors retry with backoff and log each one,
    # and a hung request must not cost several read timeouts.
    cfg.retries = False
    log(logging.INFO, "API server configured", host=cfg.host, credentials=source)
    return cfg


def new_api_client(cfg: k8s_client.Configuration) -> k8s_client.ApiClient:
    client = k8s_client.ApiClient(cfg)
    client.user_agent = "ipvsctl"
    return client
