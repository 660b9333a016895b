"""Desired state for a whole set of objects at once (`ipvsctl plan`). Pure, but it drives
source's ObjectStore and plan's rules together: a floor above both."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ipvsctl.model import (
    DesiredService,
    DesiredVirtualServer,
    NodeContext,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.model.keys import display_order, normalize_ip
from ipvsctl.plan.capacity import admit, entries, refusal
from ipvsctl.plan.capacity import rank as capacity_rank
from ipvsctl.plan.conflicts import rank, resolve
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.plan.guard import too_many
from ipvsctl.plan.skipped import (
    NOT_AN_OBJECT,
    OTHER_KIND,
    OTHER_NODE,
    Skipped,
    skipped_objects,
)
from ipvsctl.source.convert import is_headless, object_name, unproxied_reason
from ipvsctl.source.events import ObjectKind, RawObject, Replace
from ipvsctl.source.store import ObjectStore, Problem

Planned = list[tuple[DesiredService, DesiredVirtualServer]]


@dataclass(frozen=True, slots=True)
class PlanReport:
    """`ipvsctl plan`'s whole answer: what it would program, the problems found (one line
    each on stderr), and every object read that makes no virtual server, with why."""

    virtual_servers: Planned
    problems: list[Problem]
    skipped: list[Skipped]
    node: NodeContext  # as planned: with its Node's zone when the input has it


def plan_objects(
    objects: Mapping[ObjectKind, list[RawObject]], node: NodeContext
) -> tuple[Planned, list[Problem]]:
    """Every virtual server the objects ask for, sorted by key, with the problems found.
    A virtual server two Services want goes to the winner by plan/conflicts.py's rule. A
    `kind: Node` named as the node gives its zone (topology hints)."""
    chosen, problems, _, _ = _plan(objects, node)
    return chosen, problems


def plan_report(
    objects: Mapping[ObjectKind, list[RawObject]],
    node: NodeContext,
    others: Iterable[tuple[str, str, str]] = (),
) -> PlanReport:
    """`plan_objects`, and what it skipped (plan/skipped.py): `others` are the documents of
    kinds ipvsctl does not read, as (kind, namespace, name), kind "" when no object."""
    chosen, problems, store, node = _plan(objects, node)
    reasons: dict[ServiceRef, list[str]] = {}
    set_aside: list[Skipped] = []
    for p in problems:
        ns, _, name = p.name.partition("/")
        if p.kind is ObjectKind.SERVICE:
            reasons.setdefault(ServiceRef(ns, name), []).append(p.reason)
            if ServiceRef(ns, name) in store.services:
                continue  # read, and skipped (or not) by the rule below
        if p.fatal:
            set_aside.append(
                Skipped(p.kind.value, "" if p.kind is ObjectKind.NODE else ns, name, p.reason)
            )
    headless: set[ServiceRef] = set()
    for obj in objects.get(ObjectKind.SERVICE, []):
        ns, _, name = object_name(obj).partition("/")
        why = unproxied_reason(obj, node.service_proxy_name)
        if why is not None:
            set_aside.append(Skipped(ObjectKind.SERVICE.value, ns, name, why))
        elif is_headless(obj):
            headless.add(ServiceRef(ns, name))
    for obj in objects.get(ObjectKind.NODE, []):
        name = object_name(obj).partition("/")[2]
        if name != node.node_name:
            set_aside.append(
                Skipped(ObjectKind.NODE.value, "", name, OTHER_NODE.format(node=node.node_name))
            )
    for kind, ns, name in others:
        why = OTHER_KIND.format(kind=kind) if kind else NOT_AN_OBJECT
        set_aside.append(Skipped(kind, ns, name, why))
    served = {desired.ref for desired, _ in chosen}
    skipped = skipped_objects(
        store.services, served, reasons, store.slices.values(), set_aside, headless
    )
    return PlanReport(chosen, problems, skipped, node)


def _plan(
    objects: Mapping[ObjectKind, list[RawObject]], node: NodeContext
) -> tuple[Planned, list[Problem], ObjectStore, NodeContext]:
    store = ObjectStore(
        node.default_scheduler, node_name=node.node_name, service_proxy_name=node.service_proxy_name
    )
    problems: list[Problem] = []
    for kind in (ObjectKind.NODE, ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE):
        problems += store.apply(Replace(kind, objects.get(kind, []), 0.0)).problems
    if store.node is not None:
        node = dataclasses.replace(node, zone=store.node.zone)
    built: dict[ServiceRef, DesiredService] = {}
    for ref in sorted(store.services):
        refused: list[str] = []
        built[ref] = build_desired_service(store.services[ref], store.slices_of(ref), node, refused)
        whole = too_many(store.services[ref], node) is not None
        problems += (Problem(ObjectKind.SERVICE, str(ref), r, fatal=whole) for r in refused)
    # The node's table (plan/capacity.py): the newest that do not fit are refused whole,
    # and claim nothing.
    sizes = {
        ref: (capacity_rank(store.services[ref].created, ref), entries(d))
        for ref, d in built.items()
    }
    for ref in sorted(admit(sizes, node.max_table_entries)):
        problems.append(Problem(ObjectKind.SERVICE, str(ref), refusal(node.max_table_entries)))
        built[ref] = dataclasses.replace(built[ref], virtual_servers={})
    winners = resolve(
        (ref, key, rank(dvs.kind, store.services[ref].created, ref))
        for ref, desired in built.items()
        for key, dvs in desired.virtual_servers.items()
    )
    chosen: dict[ServiceKey, tuple[DesiredService, DesiredVirtualServer]] = {}
    for ref, desired in built.items():
        for key, dvs in desired.virtual_servers.items():
            if winners[key] != ref:
                problems.append(
                    Problem(
                        ObjectKind.SERVICE,
                        str(ref),
                        f"virtual server {key} is {winners[key]}'s",
                        fatal=False,
                    )
                )
                continue
            chosen[key] = (desired, dvs)
    return [chosen[k] for k in sorted(chosen, key=display_order)], problems, store, node


# The addresses a Node reports that a node proxy's NodePorts can listen on.
NODE_ADDRESS_TYPES = ("InternalIP", "ExternalIP")


def node_object_addresses(
    objects: Mapping[ObjectKind, list[RawObject]], name: str
) -> tuple[str, ...] | None:
    """`status.addresses` (InternalIP, ExternalIP) of the `kind: Node` named `name` among
    the objects, valid ones only; None when there is no such Node (or it lists none)."""
    for obj in objects.get(ObjectKind.NODE, []):
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("name") != name:
            continue
        status = obj.get("status")
        found = status.get("addresses") if isinstance(status, Mapping) else None
        ips: list[str] = []
        for a in found if isinstance(found, list) else []:
            if isinstance(a, Mapping) and a.get("type") in NODE_ADDRESS_TYPES:
                try:
                    ips.append(normalize_ip(str(a.get("address"))))
                except ValueError:
                    continue
        return tuple(dict.fromkeys(ips)) or None
    return None
