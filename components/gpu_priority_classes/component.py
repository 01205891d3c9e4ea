"""GpuPriorityClasses: the PriorityClasses GPU workloads are given.

The settings and their rules are in components/gpu_priority_classes/settings.py, the objects
in manifests.py. One PriorityClass per configured class, cluster-scoped, applied through the
stack's provider like every object of the stack (so an existing class of the same name is
refused at preview, never taken over). Any pod may name a PriorityClass; OpaGate, handed the
class names and priorityClasses.allowedNamespaces (__main__.py), refuses a pod being created
that names one of these but asks for no GPU outside those namespaces (docs/layers.md, layer 8).
"""

from __future__ import annotations

from typing import Annotated

import pulumi
import pulumi_kubernetes as k8s

from components.cluster_access import ClusterAccess, ClusterLayer
from components.gpu_priority_classes.manifests import priority_class
from components.gpu_priority_classes.settings import GpuPriorityClassesSettings
from components.settings import PROJECT, Runtime

TOKEN = f"{PROJECT}:index:GpuPriorityClasses"


class GpuPriorityClassesArgs(GpuPriorityClassesSettings):
    """Inputs of GpuPriorityClasses: its settings plus the cluster access."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""


class GpuPriorityClasses(ClusterLayer):
    """One PriorityClass per configured class."""

    names: pulumi.Output[list[str]]
    """The class names, resolved once every class exists."""

    def __init__(
        self, name: str, args: GpuPriorityClassesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, args.access, opts)
        created = [
            k8s.scheduling.v1.PriorityClass(
                f"{name}-{entry.name}", **priority_class(entry), opts=self.children
            )
            for entry in args.classes
        ]
        self.names = pulumi.Output.all(*(c.metadata.name for c in created)).apply(list)
        self.register_outputs({"names": self.names})
