"""KubeSource.from_config: kubeconfig, in-cluster, --apiserver, and one-line errors."""

from __future__ import annotations

import http.server
import logging
import os
import queue
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from devkit.fakeapi import FakeAPIServer, objects
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.listwatch import SERVICES, ListWatch
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.source.events import ObjectKind, Replace, SourceConfigError, SourceEvent

TOKEN = "s3cret"
T = TypeVar("T")


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
    # The token-refresh hook runs before every request; the host stays the override.
    assert cfg.get_api_key_with_prefix("BearerToken") == f"Bearer {TOKEN}"
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


# ---- every file a configuration names is read bounded --------------------------------------


def within(seconds: float, fn: Callable[[], T]) -> T:
    """`fn()`'s result, or a failure if it takes longer than `seconds` (a read blocked on a
    FIFO): it runs in a daemon thread, which `unblock_fifos` later frees."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if errors:
        raise errors[0]
    return out[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO nobody writes to. A reader blocked on it (the bug) is freed at the end."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    try:
        yield path
    finally:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(path) else None
        if fd is not None:
            os.close(fd)


def _has_reader(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader
        return False
    return True


def bad_file(kind: str, tmp_path: Path, fifo: Path) -> tuple[str, str]:
    """A path of `kind` and the reason expected for it."""
    if kind == "fifo":
        return str(fifo), "not a regular file (a FIFO)"
    if kind == "dev-zero":
        return "/dev/zero", "not a regular file (a character device)"
    if kind == "directory":
        return str(tmp_path), "not a regular file (a directory)"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (4 * 1024 * 1024 + 1))
    return str(big), "larger than"


KINDS = ["fifo", "dev-zero", "directory", "too-large"]


def kubeconfig_naming(tmp_path: Path, server: str, user: str, cluster: str = "") -> Path:
    path = tmp_path / "named-kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: {server}
{cluster}users:
- name: u
  user:
{user}contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"""
    )
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_a_kubeconfig_that_is_no_regular_file_is_one_line(tmp_path, fifo, kind) -> None:
    path, reason = bad_file(kind, tmp_path, fifo)
    message = within(5, lambda: error_of(kubeconfig=path, environ={}))
    assert message.startswith(f"cannot read kubeconfig {path}: ") and reason in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "key", ["tokenFile", "client-certificate", "client-key", "certificate-authority"]
)
def test_a_file_the_kubeconfig_names_is_read_bounded(tmp_path, fifo, key, kind) -> None:
    path, reason = bad_file(kind, tmp_path, fifo)
    good = tmp_path / "good.pem"
    good.write_text("not read over the wire here")
    files = {k: str(good) for k in ("client-certificate", "client-key")} | {key: path}
    user = "".join(f"    {k}: {v}\n" for k, v in files.items() if k != "certificate-authority")
    if key == "tokenFile":
        user += f"    tokenFile: {path}\n"
    cluster = f"    certificate-authority: {path}\n" if key == "certificate-authority" else ""
    config = kubeconfig_naming(tmp_path, "https://192.0.2.1:6443", user, cluster)
    message = within(5, lambda: error_of(kubeconfig=str(config), environ={}))
    assert message.startswith(f"invalid kubeconfig {config}: {key} {path}: ")
    assert reason in message


IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.mark.parametrize("kind", [*KINDS, "empty"])
@pytest.mark.parametrize("which", ["token", "CA"])
def test_in_cluster_files_are_read_bounded(tmp_path, fifo, which, kind) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text(TOKEN)
    ca.write_text("a CA")
    if kind == "empty":
        path, reason = str(tmp_path / "empty"), "empty"
        Path(path).write_text("  \n")
    else:
        path, reason = bad_file(kind, tmp_path, fifo)
    files = {"token_file": str(token), "ca_file": str(ca)}
    files["token_file" if which == "token" else "ca_file"] = path

    def load() -> str:
        with pytest.raises(SourceConfigError) as info:
            load_configuration(None, None, environ=IN_CLUSTER, **files)
        return str(info.value)

    message = within(5, load)
    assert message.startswith(f"in-cluster API config: {which} {path}: ") and reason in message


def test_in_cluster_reads_the_token_and_hands_the_ca_over_as_data(tmp_path) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text(TOKEN + "\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n...\n")
    cfg = load_configuration(None, None, environ=IN_CLUSTER, token_file=str(token), ca_file=str(ca))
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.get_api_key_with_prefix("BearerToken") == f"Bearer {TOKEN}"
    assert cfg.ssl_ca_cert is None and cfg.ca_cert_data == ca.read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_a_token_reread_never_blocks_and_keeps_the_token(tmp_path, fifo, kind, caplog) -> None:
    """The re-read runs before every request, on the watches' threads: a FIFO or
    /dev/zero swapped in for the token must cost neither a thread nor the memory."""
    from ipvsctl.kube import config as kube_config

    now = [1000.0]
    token_file = tmp_path / "token"
    token_file.write_text("first")
    cfg = load_configuration(
        str(kubeadm_kubeconfig(tmp_path, "https://192.0.2.1:6443", token_file)), None
    )
    path, _ = bad_file(kind, tmp_path, fifo)
    kube_config._reread_token(cfg, path, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="ipvsctl.kube")
    for _ in range(3):
        now[0] += kube_config.TOKEN_REREAD_SECONDS
        within(5, lambda: cfg.refresh_api_key_hook(cfg))
        assert cfg.api_key["BearerToken"] == "Bearer first"
    lines = [
        r for r in caplog.records if r.getMessage() == "token file unreadable, keeping the token"
    ]
    assert len(lines) == 1  # once per streak


def test_a_kubeconfig_ca_verifies_the_server_and_is_not_read_again(tmp_path) -> None:
    """Over real TLS: the CA a kubeconfig names verifies the API server; it is read once, as
    data, so a connection made after the file changed (or became a FIFO) does not read it."""
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    server = tls_server(cert, key)
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        config = kubeconfig_naming(
            tmp_path,
            url,
            f"    token: {TOKEN}\n",
            f"    certificate-authority: {cert}\n",
        )
        cfg = load_configuration(str(config), None, environ={})
        assert cfg.ssl_ca_cert is None
        assert within(10, lambda: ListWatch(new_api_client(cfg), SERVICES)().status) == 200
        cert.write_text("no longer a certificate")
        assert within(10, lambda: ListWatch(new_api_client(cfg), SERVICES)().status) == 200
        wrong = kubeconfig_naming(
            tmp_path, url, f"    token: {TOKEN}\n", f"    certificate-authority: {key}\n"
        )
        with pytest.raises(Exception, match=r"(?i)certificate|ssl"):
            within(
                10,
                lambda: ListWatch(
                    new_api_client(load_configuration(str(wrong), None, environ={})), SERVICES
                )(),
            )
    finally:
        server.shutdown()
        server.server_close()


def tls_server(cert: Path, key: Path) -> http.server.HTTPServer:
    """An HTTPS server on 127.0.0.1 that answers every GET with an empty ServiceList."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"kind":"ServiceList","metadata":{"resourceVersion":"1"},"items":[]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
