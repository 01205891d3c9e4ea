"""Kubernetes object metadata as the layers write it: name, namespace and the stack's labels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.settings import PROJECT

PART_OF: Mapping[str, str] = {"app.kubernetes.io/part-of": PROJECT}
"""The label on every object the stack owns: bookkeeping, never asked of a namespace the stack
uses without owning it (NamespaceLabel is what is)."""


POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
"""Pod Security admission's enforce level label on a namespace.
Ref: https://kubernetes.io/docs/concepts/security/pod-security-admission/"""


@dataclass(frozen=True)
class NamespaceLabel:
    """A label a layer's pods need on their namespace to run or to work (Pod Security's enforce
    level, DRA admin access), with why. One home for both uses: the layer puts it on the
    namespace it creates, and with createNamespace false the ownership check refuses an
    existing namespace without it (components/ownership.py, namespace_problems)."""

    key: str
    value: str
    why: str
    """What breaks without it, for the refusal."""


def namespace_labels(required: Iterable[NamespaceLabel]) -> dict[str, str]:
    """{key: value} of `required`, for a namespace's metadata."""
    return {label.key: label.value for label in required}


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
