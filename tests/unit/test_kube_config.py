"""KubeSource.from_config: kubeconfig, in-cluster, --apiserver, and one-line errors."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.source.events import ObjectKind, Replace, SourceConfigError, SourceEvent

try:
    from devkit.fakeapi import FakeAPIServer, objects
except ModuleNotFoundError:  # plain `pytest` does not put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from devkit.fakeapi import FakeAPIServer, objects

TOKEN = "s3cret"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer(token=TOKEN).start()
    server.add(objects.service("web", cluster_ip="10.96.0.10"))
    try:
        yield server
    finally:
        server.stop()


def kubeconfig(tmp_path: Path, server: str, token: str = TOKEN) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}"}}
users:
- name: u
  user: {{token: "{token}"}}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"""
    )
    return path


def first_replace(source: KubeSource) -> Replace:
    """Run the source until its first Replace of Services."""
    events: queue.Queue[SourceEvent] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=source.run, args=(events.put, stop), daemon=True)
    thread.start()
    try:
        while True:
            event = events.get(timeout=5)
            if isinstance(event, Replace) and event.kind is ObjectKind.SERVICE:
                return event
    finally:
        stop.set()
        thread.join(5)


def error_of(**kwargs: object) -> str:
    with pytest.raises(SourceConfigError) as info:
        KubeSource.from_config(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_kubeconfig_with_token(api: FakeAPIServer, tmp_path: Path) -> None:
    source = KubeSource.from_config(str(kubeconfig(tmp_path, api.url)), environ={})
    listed = {o["metadata"]["name"] for o in first_replace(source).objects}
    assert listed == {"web", "kubernetes"}  # the fake, like a cluster, has default/kubernetes


def test_kubeconfig_from_the_environment(api: FakeAPIServer, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, api.url)
    source = KubeSource.from_config(None, environ={"KUBECONFIG": str(path)})
    assert source.host == api.url


def test_apiserver_overrides_the_kubeconfig_server(api: FakeAPIServer, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "https://10.96.0.1:443")  # a ClusterIP: must not be used
    source = KubeSource.from_config(str(path), api.url, environ={})
    assert source.host == api.url
    assert first_replace(source).objects


def test_in_cluster_credentials_with_apiserver_override(api: FakeAPIServer, tmp_path: Path) -> None:
    token_file, ca_file = tmp_path / "token", tmp_path / "ca.crt"
    token_file.write_text(TOKEN)
    ca_file.write_text("not used over http")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = load_configuration(
        None, api.url, environ=env, token_file=str(token_file), ca_file=str(ca_file)
    )
    # The loader's token-refresh hook rewrites the host on every request; it must not win.
    assert cfg.get_api_key_with_prefix("BearerToken") == f"bearer {TOKEN}"
    assert cfg.host == api.url
    source = KubeSource(new_api_client(cfg), settings=KubeSettings(backoff_initial=0.01))
    assert first_replace(source).objects
    assert all(r.path.startswith("/api") for r in api.requests)


def test_in_cluster_without_token_file(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(SourceConfigError, match=r"in-cluster API config: .*token"):
        load_configuration(None, None, environ=env, token_file=str(tmp_path / "missing"))


def test_no_configuration_at_all() -> None:
    message = error_of(kubeconfig=None, apiserver=None, environ={})
    assert message.startswith("no Kubernetes API configuration")
    assert "--kubeconfig" in message


def test_apiserver_alone_is_enough() -> None:
    source = KubeSource.from_config(None, "http://127.0.0.1:6443/", environ={})
    assert source.host == "http://127.0.0.1:6443"


def test_missing_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    assert error_of(kubeconfig=str(path), environ={}) == (
        f"cannot read kubeconfig {path}: No such file or directory"
    )


@pytest.mark.parametrize(
    "text",
    ["{{{ not yaml", "apiVersion: v1\nkind: Config\n", "current-context: x\ncontexts: []\n"],
)
def test_invalid_kubeconfig(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    assert error_of(kubeconfig=str(path), environ={}).startswith(f"invalid kubeconfig {path}: ")


@pytest.mark.parametrize("url", ["10.0.0.1:6443", "ftp://x", "http://"])
def test_invalid_apiserver_url(url: str) -> None:
    assert error_of(apiserver=url, environ={}).startswith("invalid API server URL")


def kubeadm_kubeconfig(tmp_path: Path, server: str, token_file: Path) -> Path:
    """kube-system/kube-proxy's kubeconfig.conf as kubeadm writes it (the pod's service
    account's CA and projected token), pointed at `server`."""
    path = tmp_path / "kubeconfig.conf"
    (tmp_path / "ca.crt").write_text("a CA, not read over http")
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: {tmp_path / "ca.crt"}
    server: {server}
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: {token_file}
"""
    )
    return path


def test_kubeadm_kube_proxy_kubeconfig_token_file(api: FakeAPIServer, tmp_path: Path) -> None:
    """kubeadm's kube-proxy kubeconfig authenticates with `tokenFile`: ipvsctl reads it, and
    re-reads it as the kubelet rotates the projected token."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    cfg = load_configuration(str(kubeadm_kubeconfig(tmp_path, api.url, token_file)), None)
    assert cfg.get_api_key_with_prefix("BearerToken") == f"Bearer {TOKEN}"
    source = KubeSource(new_api_client(cfg), settings=KubeSettings(backoff_initial=0.01))
    assert first_replace(source).objects


def test_token_file_is_reread_once_a_minute(tmp_path: Path) -> None:
    from ipvsctl.kube import config as kube_config

    now = [1000.0]
    token_file = tmp_path / "token"
    token_file.write_text("first")
    cfg = load_configuration(
        str(kubeadm_kubeconfig(tmp_path, "https://192.0.2.1:6443", token_file)), None
    )
    kube_config._reread_token(cfg, str(token_file), clock=lambda: now[0])
    token_file.write_text("second")
    cfg.refresh_api_key_hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer first"  # not yet a minute
    now[0] += kube_config.TOKEN_REREAD_SECONDS
    cfg.refresh_api_key_hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second"
    token_file.unlink()  # a failed read keeps the token it has
    now[0] += kube_config.TOKEN_REREAD_SECONDS
    cfg.refresh_api_key_hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second"
