"""Manifest files, an adapter (file I/O): read into raw objects for `ipvsctl plan -f`
(files.py, with safeyaml's bounded YAML and safejson's bounded JSON), and followed as the
daemon's object source with `--manifests DIR` (source.py)."""

from ipvsctl.manifests.files import ManifestError, load_file, load_paths
from ipvsctl.manifests.source import ManifestSource

__all__ = ["ManifestError", "ManifestSource", "load_file", "load_paths"]
