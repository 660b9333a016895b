"""This node's own Node from the API server: one list+watch of one object, by field selector
(as kube-proxy's node informer), through the same reflector as Services.

A Node that cannot be read must not stop the daemon. The first time the list fails
(forbidden: an old ClusterRole; or any other error), one line says so and an empty Replace
of Nodes goes out, so the first sync does not wait for it: no zone (no topology), and the
node counts as eligible for cloud load balancers. The reflector keeps retrying, and the Node
is used as soon as it can be read. A Node that does not exist lists as empty: the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ipvsctl.kube.logs import describe, log
from ipvsctl.kube.watch import ListFunc
from ipvsctl.source.events import ObjectKind, Replace, SourceEvent


def node_list_func(
    list_node: ListFunc,
    node_name: str,
    emit: Callable[[SourceEvent], None],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> ListFunc:
    """`list_node` limited to `node_name`, with the first-failure fallback above."""
    selector = f"metadata.name={node_name}"
    state = {"listed": False, "reported": False}
    lock = threading.Lock()

    def call(*args: Any, **kwargs: Any) -> Any:
        watch = bool(kwargs.get("watch"))
        try:
            resp = list_node(*args, field_selector=selector, **kwargs)
        except Exception as exc:
            if not watch:
                _failed(exc)
            raise
        if not watch:
            with lock:
                state["listed"] = True
        return resp

    def _failed(exc: BaseException) -> None:
        with lock:
            if state["listed"] or state["reported"]:
                return
            state["reported"] = True
        log(
            logging.WARNING,
            "node object not readable: no zone for topology hints, node counted eligible; retrying",
            node=node_name,
            error=describe(exc),
        )
        emit(Replace(ObjectKind.NODE, [], clock()))

    return call
