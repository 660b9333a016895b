"""The listen-node-ip component (docs/install.md, "Who reaches the daemon's port"), rendered
by the real kubectl: alone and after the kube-proxy takeover, the daemon listens on its
Pod's status.hostIP only (the last --listen wins, as the CLI parses it), and the commands
run in its container ask it there."""

from __future__ import annotations

import re

import pytest
import typer.main

from ipvsctl.cli.app import app
from ipvsctl.cli.params import daemon_url

from .helpers import one, overlay_with, render

COMBINATIONS = [("listen-node-ip",), ("kube-proxy-takeover", "listen-node-ip")]


def container(components: tuple[str, ...]) -> dict:
    ds = one(render(overlay_with(*components)), "DaemonSet", "ipvsctl")
    (main,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "ipvsctl"]
    return main


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def env_of(main: dict, host_ip: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in main["env"]:
        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.hostIP":
            out[e["name"]] = host_ip
        elif "value" in e:
            out[e["name"]] = expand(e["value"], out)
    return out


@pytest.mark.parametrize("components", COMBINATIONS, ids="+".join)
@pytest.mark.parametrize("host_ip", ["10.0.0.5", "fd00::5"])
def test_the_daemon_listens_on_the_node_address_only(components, host_ip):
    main = container(components)
    env = env_of(main, host_ip)
    args = [expand(a, env) for a in main["args"]]
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    ctx = run.make_context("run", args[1:])
    assert ctx.params["listen"] == f"{host_ip}:9796"
    # status, node-drain and cleanup in this container ask the daemon at that address
    assert daemon_url(env["IPVSCTL_ENDPOINT"]) == (
        f"http://[{host_ip}]:9796" if ":" in host_ip else f"http://{host_ip}:9796"
    )


def test_without_it_the_daemon_listens_on_every_address():
    main = container(())
    assert "0.0.0.0:9796" in main["args"]
    assert not any(e["name"] in ("HOST_IP", "IPVSCTL_ENDPOINT") for e in main["env"])


@pytest.mark.parametrize("command", ["status", "node-drain", "cleanup"])
def test_the_commands_that_ask_the_daemon_read_its_address_from_the_env(command):
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    (endpoint,) = [p for p in cmd.params if "--endpoint" in p.opts]
    assert endpoint.envvar == "IPVSCTL_ENDPOINT"
