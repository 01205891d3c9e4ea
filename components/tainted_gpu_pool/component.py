"""TaintedGpuPool: taint and label the GPU nodes so only GPU pods land there.

One dynamic resource for the whole pool (components/tainted_gpu_pool/provider.py): per node it
edits only its own entry of spec.taints, so the taints Kubernetes manages stay, sets the
labels, and records on the node what each replaced, so destroy puts back what was there. The
engine sees one resource however many nodes the pool has; the provider diffs and patches per
node, and the component fails the run naming every node that could not be changed while the
others are done. The nodes, the taint, its toleration and the labels are outputs: later layers
take them from here, never from config.
"""

from __future__ import annotations

from typing import Annotated

import pulumi

from components.cluster_access import ClusterAccess
from components.providers.node_set import failure_message
from components.settings import PROJECT, Runtime
from components.tainted_gpu_pool.provider import GpuPoolNodes
from components.tainted_gpu_pool.settings import TaintedGpuPoolSettings

TOKEN = f"{PROJECT}:index:TaintedGpuPool"


class TaintedGpuPoolArgs(TaintedGpuPoolSettings):
    """Inputs of TaintedGpuPool: its settings plus the cluster access."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster access: the node set waits for its claim (the node providers read the
    credentials from the stack config)."""


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
        nodes = list(args.nodes)
        pool = GpuPoolNodes(
            f"{name}-nodes",
            nodes=nodes,
            key=args.taint.key,
            value=args.taint.value,
            effect=args.taint.effect,
            labels=dict(args.labels),
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.access.after(opts)),
        )
        # The outputs resolve only when every node is done (a failed node fails the run, naming
        # it), so later layers wait for them and never see a half-tainted pool as done. At
        # preview nothing is written and the node set's results are unknown while it is being
        # changed: the values, which come from the config, are handed on through the node set's
        # id (known), so a change to the pool previews as a change of the pool alone.
        done = pool.failed.apply(lambda failed: _all_done(failed, len(nodes)))
        settled = pool.id if pulumi.runtime.is_dry_run() else done
        self.nodes = settled.apply(lambda _: nodes)
        self.taint = settled.apply(lambda _: args.taint.as_dict())
        self.toleration = settled.apply(lambda _: args.taint.toleration())
        self.labels = settled.apply(lambda _: dict(args.labels))
        self.register_outputs(
            {
                "nodes": self.nodes,
                "taint": self.taint,
                "toleration": self.toleration,
                "labels": self.labels,
            }
        )


def _all_done(failed: dict[str, str] | None, total: int) -> bool:
    if failed:
        raise pulumi.RunError(failure_message("GPU pool taint and labels", failed, total))
    return True
