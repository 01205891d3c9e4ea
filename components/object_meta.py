"""Kubernetes object metadata as the layers write it: name, namespace and the stack's labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.settings import PROJECT

PART_OF: Mapping[str, str] = {"app.kubernetes.io/part-of": PROJECT}
"""The label on every object the stack owns."""


def object_meta(
    name: str, namespace: object | None = None, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An object's metadata; a namespace or labels left None are left out.

    `namespace` is a name, or the component's Output of one, passed through untouched (so the
    object waits for its namespace).
    """
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    return meta
