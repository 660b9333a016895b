"""A small kustomize, for machines without `kubectl kustomize`.

Covers what daemonset/ and its overlays use, and nothing more: `resources` (files and
kustomization directories), `components`, `namespace`, `labels` (pairs, includeTemplates),
`images` and `configMapGenerator` (literals; create/merge/replace, with kustomize's
content-hash name suffix and the references to it in pod templates). Anything else in a
kustomization is an error, so the tests never silently ignore a field. When kubectl is
installed, test_deploy_render.py checks this renderer's output against it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "Node",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
POD_TEMPLATE_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}
_GENERATED = "kustomize-lite/generated-name"  # internal marker, removed before output


class KustomizeError(Exception):
    pass


def build(path: str | Path) -> list[Doc]:
    """Renders the kustomization in `path`, like `kubectl kustomize path`."""
    docs = _build(Path(path).resolve(), is_component=False)
    _apply_name_hashes(docs)
    return docs


def _load_kustomization(root: Path) -> Doc:
    for name in KUSTOMIZATION_NAMES:
        f = root / name
        if f.is_file():
            k = yaml.safe_load(f.read_text()) or {}
            unknown = set(k) - SUPPORTED_FIELDS
            if unknown:
                raise KustomizeError(f"{f}: unsupported fields {sorted(unknown)}")
            return k
    raise KustomizeError(f"no kustomization in {root}")


def _load_docs(f: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(f.read_text()) if d]


def _build(root: Path, *, is_component: bool, docs: list[Doc] | None = None) -> list[Doc]:
    k = _load_kustomization(root)
    kind = k.get("kind", "Kustomization")
    if is_component != (kind == "Component"):
        wanted = "Component" if is_component else "Kustomization"
        raise KustomizeError(f"{root}: kind {kind} where a {wanted} belongs")
    docs = [] if docs is None else docs
    for res in k.get("resources", []):
        p = root / res
        if p.is_dir():
            docs.extend(_build(p, is_component=False))
        else:
            docs.extend(_load_docs(p))
    for gen in k.get("configMapGenerator", []):
        _generate_configmap(docs, gen, k.get("namespace"))
    for comp in k.get("components", []):
        docs = _build(root / comp, is_component=True, docs=docs)
    if "namespace" in k:
        _set_namespace(docs, k["namespace"])
    for lab in k.get("labels", []):
        _add_labels(docs, lab)
    for img in k.get("images", []):
        _set_image(docs, img)
    return docs


def _generate_configmap(docs: list[Doc], gen: Doc, namespace: str | None) -> None:
    name = gen["name"]
    ns = gen.get("namespace", namespace)
    data: dict[str, str] = {}
    for lit in gen.get("literals", []):
        key, _, value = lit.partition("=")
        data[key] = value
    unknown = set(gen) - {"name", "namespace", "literals", "behavior"}
    if unknown:
        raise KustomizeError(f"configMapGenerator {name}: unsupported fields {sorted(unknown)}")
    behavior = gen.get("behavior", "create")
    existing = [
        d
        for d in docs
        if d.get("kind") == "ConfigMap"
        and d["metadata"].get("annotations", {}).get(_GENERATED) == name
    ]
    if behavior == "create":
        if existing:
            raise KustomizeError(
                f"configMapGenerator {name}: already generated (use behavior: merge)"
            )
        cm: Doc = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "annotations": {_GENERATED: name}},
            "data": data,
        }
        if ns:
            cm["metadata"]["namespace"] = ns
        docs.append(cm)
        return
    if len(existing) != 1:
        raise KustomizeError(
            f"configMapGenerator {name}: behavior {behavior} but no base ConfigMap"
        )
    if behavior == "merge":
        existing[0].setdefault("data", {}).update(data)
    elif behavior == "replace":
        existing[0]["data"] = data
    else:
        raise KustomizeError(f"configMapGenerator {name}: unknown behavior {behavior}")


def _set_namespace(docs: list[Doc], namespace: str) -> None:
    for d in docs:
        if d.get("kind") not in CLUSTER_SCOPED:
            d["metadata"]["namespace"] = namespace


def _pod_templates(d: Doc) -> list[Doc]:
    if d.get("kind") in POD_TEMPLATE_KINDS:
        return [d["spec"]["template"]]
    return []


def _add_labels(docs: list[Doc], lab: Doc) -> None:
    unknown = set(lab) - {"pairs", "includeTemplates", "includeSelectors"}
    if unknown or lab.get("includeSelectors"):
        raise KustomizeError(f"labels: unsupported {sorted(unknown) or 'includeSelectors: true'}")
    pairs = lab.get("pairs", {})
    for d in docs:
        d["metadata"].setdefault("labels", {}).update(pairs)
        if lab.get("includeTemplates"):
            for t in _pod_templates(d):
                t.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _image_name(image: str) -> str:
    if "@" in image:
        return image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        return image[: len(image) - len(last)] + last.split(":", 1)[0]
    return image


def _set_image(docs: list[Doc], img: Doc) -> None:
    for d in docs:
        for t in _pod_templates(d):
            spec = t["spec"]
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                if _image_name(c["image"]) != img["name"]:
                    continue
                new = img.get("newName", img["name"])
                if "digest" in img:
                    c["image"] = f"{new}@{img['digest']}"
                elif "newTag" in img:
                    c["image"] = f"{new}:{img['newTag']}"
                else:
                    tag = c["image"][len(_image_name(c["image"])) :]
                    c["image"] = new + tag


def configmap_hash(data: dict[str, str]) -> str:
    """kustomize's name suffix for a generated ConfigMap (sigs.k8s.io/kustomize/api/hasher)."""
    encoded = json.dumps(
        {"data": data, "kind": "ConfigMap", "name": ""}, separators=(",", ":"), sort_keys=True
    )
    digest = hashlib.sha256(encoded.encode()).hexdigest()
    return digest[:10].translate(str.maketrans("013ae", "ghkmt"))


def _apply_name_hashes(docs: list[Doc]) -> None:
    renames: dict[str, str] = {}
    for d in docs:
        annotations = d["metadata"].get("annotations", {})
        if _GENERATED not in annotations:
            continue
        del annotations[_GENERATED]
        if not annotations:
            del d["metadata"]["annotations"]
        old = d["metadata"]["name"]
        d["metadata"]["name"] = f"{old}-{configmap_hash(d.get('data', {}))}"
        renames[old] = d["metadata"]["name"]
    for d in docs:
        for t in _pod_templates(d):
            _rename_configmap_refs(t["spec"], renames)


def _rename_configmap_refs(spec: Doc, renames: dict[str, str]) -> None:
    def fix(ref: Doc | None) -> None:
        if ref and ref.get("name") in renames:
            ref["name"] = renames[ref["name"]]

    for c in spec.get("initContainers", []) + spec.get("containers", []):
        for env in c.get("env", []):
            fix(env.get("valueFrom", {}).get("configMapKeyRef"))
        for env_from in c.get("envFrom", []):
            fix(env_from.get("configMapRef"))
    for vol in spec.get("volumes", []):
        fix(vol.get("configMap"))
        for src in vol.get("projected", {}).get("sources", []):
            fix(src.get("configMap"))


def canonical(docs: list[Doc]) -> list[Doc]:
    """The documents sorted by identity, for order-insensitive comparison."""

    def key(d: Doc) -> tuple[str, str, str, str]:
        m = d.get("metadata", {})
        return (
            d.get("apiVersion", ""),
            d.get("kind", ""),
            m.get("namespace", ""),
            m.get("name", ""),
        )

    return sorted((copy.deepcopy(d) for d in docs), key=key)
