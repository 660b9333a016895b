"""`run --config` (and `check-config`): kube-proxy's KubeProxyConfiguration file read (bounded,
the safe YAML loader) and handed to its one mapping table (source/kubeproxy_config.py)."""

from __future__ import annotations

from pathlib import Path

from ipvsctl.source.kubeproxy_config import Settings


class ConfigFileError(ValueError):
    """The file cannot be used: one line naming it (and the field), exit 2."""


# The `run` parameters a KubeProxyConfiguration can set (source/kubeproxy_config.py).
FILE_FLAGS = frozenset(
    {
        "kubeconfig",
        "node_name",
        "scheduler",
        "ipvs_tcp_timeout",
        "ipvs_tcpfin_timeout",
        "ipvs_udp_timeout",
        "log_format",
        "log_level",
        "cluster_cidr",
        "masquerade_all",
        "healthz_bind_address",
    }
)
CONFIG_MAX_BYTES = 1 << 20  # kubeadm's file is ~2 KB


def read_config_file(path: Path) -> Settings:
    """--config: the file read, parsed (the bounded YAML loader) and translated; ConfigFileError
    (one line naming the file and the field) otherwise."""
    import yaml

    from ipvsctl.manifests.safeyaml import load_all_yaml, parse_error
    from ipvsctl.source.kubeproxy_config import KubeProxyConfigError, translate

    try:
        with path.open("rb") as fh:
            data = fh.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: {exc.strerror or exc}") from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigFileError(f"--config {path}: larger than {CONFIG_MAX_BYTES} bytes")
    try:
        docs = [d for d in load_all_yaml(data.decode("utf-8")) if d is not None]
    except UnicodeDecodeError:
        raise ConfigFileError(f"--config {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"--config {parse_error(str(path), 'YAML', exc)}") from None
    if len(docs) != 1:
        raise ConfigFileError(
            f"--config {path}: want one KubeProxyConfiguration, found {len(docs)}"
        )
    try:
        settings = translate(docs[0])
    except KubeProxyConfigError as exc:
        raise ConfigFileError(f"--config {path}: {exc}") from None
    kubeconfig = settings.flags.get("kubeconfig")
    if kubeconfig and not Path(kubeconfig).is_absolute():  # as kubelet: beside the file
        settings.flags["kubeconfig"] = str(path.parent / kubeconfig)
    return settings
