"""TaintedGpuPool: taint and label the GPU nodes so only GPU pods land there.

One dynamic resource per (node, taint) (components/providers/node_taint.py) edits only its own
entry of spec.taints, so the taints Kubernetes manages stay, and a taint that was there before
is put back by destroy. Labels are a map, so a NodePatch applies them server-side and owns just
those keys. The nodes, the taint, its toleration and the labels are outputs: later layers take
them from here, never from config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field

from components.cluster_access import ClusterAccess
from components.providers.node_taint import NodeTaint
from components.settings import (
    LABEL_KEY,
    LABEL_VALUE,
    QUALIFIED_NAME,
    NodeRefs,
    Rule,
    Runtime,
    Settings,
    is_label_value,
    text,
)

TOKEN = "gpu-cluster:index:TaintedGpuPool"

# GPU pods tolerate the pool's taint through the API server's ExtendedResourceToleration
# admission plugin, which adds `{key: <requested resource>, operator: Exists, effect:
# NoSchedule}` and nothing for NoExecute. A NoExecute pool would keep every GPU pod Pending
# and evict what runs on the nodes without its own toleration (device plugin, node exporter,
# CSI and logging agents), so it is refused rather than documented.
TaintEffect = Literal["NoSchedule", "PreferNoSchedule"]
TAINT_EFFECTS: tuple[TaintEffect, ...] = get_args(TaintEffect)
TAINT_EFFECT = Rule(
    f"allowed: {', '.join(TAINT_EFFECTS)} (not NoExecute: ExtendedResourceToleration gives GPU "
    "pods only NoSchedule tolerations, so they would stay Pending, and the taint would evict "
    "the node's agents)",
    lambda v: isinstance(v, str) and v in TAINT_EFFECTS,
)
DEFAULT_LABELS: Mapping[str, str] = {"gpu-cluster.io/pool": "gpu"}


class Taint(Settings):
    """A node taint; the default is the one the GPU Operator's daemonsets tolerate."""

    key: Annotated[str, QUALIFIED_NAME] = "nvidia.com/gpu"
    """Taint key (a qualified name)."""
    value: Annotated[str, text(is_label_value, "expected <= 63 alphanumerics, '-', '_' or '.'")] = (
        "present"
    )
    """Taint value (may be empty)."""
    effect: Annotated[TaintEffect, TAINT_EFFECT] = "NoSchedule"
    """NoSchedule or PreferNoSchedule: the effects GPU pods are given a toleration for."""

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}

    def toleration(self) -> dict[str, str]:
        """The toleration a pod needs to run on a node with this taint."""
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


class TaintedGpuPoolSettings(Settings):
    """The GPU nodes, their taint and labels (the stack config's gpuPool)."""

    nodes: NodeRefs = ()
    """Names of the GPU nodes, each in the inventory (gpu-cluster:nodes)."""
    taint: Taint = Field(default_factory=Taint)
    """Taint put on every GPU node; other taints on the node are left alone."""
    labels: dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]] = Field(
        default_factory=lambda: dict(DEFAULT_LABELS)
    )
    """Labels put on every GPU node (server-side apply; destroy removes only these)."""


class TaintedGpuPoolArgs(TaintedGpuPoolSettings):
    """Inputs of TaintedGpuPool: its settings plus the cluster access."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster credentials and provider."""


class TaintedGpuPool(pulumi.ComponentResource):
    """Taints and labels GPU nodes without touching the taints Kubernetes manages."""

    nodes: pulumi.Output[list[str]]
    """GPU node names, resolved once every node is tainted and labelled."""
    taint: pulumi.Output[dict[str, str]]
    """The pool's taint {key, value, effect}; later layers derive tolerations from it."""
    toleration: pulumi.Output[dict[str, str]]
    """The toleration matching the taint."""
    labels: pulumi.Output[dict[str, str]]
    """Labels on every GPU node (usable as a nodeSelector)."""

    def __init__(
        self, name: str, args: TaintedGpuPoolArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        k8s_child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)

        done: list[pulumi.Output[Any]] = []
        for node in args.nodes:
            taint = NodeTaint(
                f"{name}-taint-{node}",
                node=node,
                key=args.taint.key,
                value=args.taint.value,
                effect=args.taint.effect,
                opts=child,
            )
            done.append(taint.id)
            if args.labels:
                # Labels are a map, so server-side apply owns just these keys.
                labels = k8s.core.v1.NodePatch(
                    f"{name}-labels-{node}",
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=dict(args.labels)),
                    opts=k8s_child,
                )
                done.append(labels.id)

        ready = pulumi.Output.all(*done)
        self.nodes = ready.apply(lambda _: list(args.nodes))
        self.taint = ready.apply(lambda _: args.taint.as_dict())
        self.toleration = ready.apply(lambda _: args.taint.toleration())
        self.labels = ready.apply(lambda _: dict(args.labels))
        self.register_outputs(
            {
                "nodes": self.nodes,
                "taint": self.taint,
                "toleration": self.toleration,
                "labels": self.labels,
            }
        )
