"""Where the API server is and how to authenticate: kubeconfig, in-cluster service account,
and the `--apiserver` override. Every failure becomes one SourceConfigError line."""

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
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)
from urllib3.connection import HTTPConnection

from ipvsctl.kube.logs import log
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
    """Use `host` for every request. The kubeconfig and in-cluster loaders install a token
    refresh hook that rewrites `configuration.host` on each request; run it against a scratch
    object that shares only the credentials, so another thread can never see the in-cluster
    ClusterIP even for a moment."""
    cfg.host = host
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


def _reread_token(
    cfg: k8s_client.Configuration,
    token_file: str,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Re-read a kubeconfig's `tokenFile` at most once a minute, as client-go does: the
    kubelet rotates projected service-account tokens, and the Python client reads the file
    once. A failed read keeps the token it has (the API server's answer says if it expired)."""
    read_at = clock()

    def refresh(c: Any) -> None:
        nonlocal read_at
        if clock() - read_at < TOKEN_REREAD_SECONDS:
            return
        read_at = clock()
        try:
            with open(token_file) as fh:
                token = fh.read().strip()
        except OSError:
            return
        if token:
            c.api_key["BearerToken"] = f"Bearer {token}"

    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed None in the client


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
        problems = []
        for file in [p for p in path.split(os.pathsep) if p]:
            try:
                with open(os.path.expanduser(file), "rb"):
                    pass
            except OSError as exc:
                problems.append(f"cannot read kubeconfig {file}: {exc.strerror or _one_line(exc)}")
            else:
                break
        else:
            raise SourceConfigError(problems[0] if problems else "empty kubeconfig path")
        try:
            # load_kube_config's own steps, keeping the loader to see its user's tokenFile
            loader = kube_config._get_kube_config_loader(
                filename=path,
                active_context=context,
                persist_config=False,  # never write to the user's kubeconfig
            )
            loader.load_and_set(cfg)
        except Exception as exc:
            raise SourceConfigError(f"invalid kubeconfig {path}: {_one_line(exc)}") from None
        user_token_file = _token_file(loader)
        if user_token_file:
            _reread_token(cfg, user_token_file)
        source = "kubeconfig"
    elif env.get(IN_CLUSTER_HOST_ENV):
        try:
            loader = InClusterConfigLoader(
                token_filename=token_file, cert_filename=ca_file, environ=env
            )
            loader.load_and_set(cfg)
        except Exception as exc:
            raise SourceConfigError(f"in-cluster API config: {_one_line(exc)}") from None
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
