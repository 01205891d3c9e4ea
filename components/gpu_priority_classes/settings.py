"""The priorityClasses section of the stack config: GpuPriorityClasses' settings.

A set of PriorityClasses for GPU workloads (say, inference above training above batch), so
that a pending job of a higher class may preempt a lower one on a full pool and a batch job
never preempts anything. Cluster-scoped, so the rules keep them from touching anyone else:
`system-` names are Kubernetes' own, values above 1,000,000,000 are for system classes only,
and none is the cluster's global default (that would change the priority of every pod of every
team). A class is cluster-scoped, and the API server lets any pod in any namespace name it: the
gate (OpaGate) is what keeps them to GPU work, refusing a pod that names one but asks for no
GPU, outside `allowedNamespaces` (docs/layers.md, layer 8).
Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field

from components.kubernetes_names import is_dns1123_label, is_dns1123_subdomain
from components.settings import BOOL, STRING, Settings, between, choice, problem, text, unique

HIGHEST_USER_PRIORITY = 1_000_000_000
"""The highest value a PriorityClass may have outside the `system-` names (the API server's
HighestUserDefinablePriority)."""
LOWEST_PRIORITY = -(2**31)
SYSTEM_PREFIX = "system-"

PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]

CLASS_NAME = text(
    lambda v: is_dns1123_subdomain(v) and not v.startswith(SYSTEM_PREFIX),
    f"expected a PriorityClass name (DNS-1123 subdomain), not starting with {SYSTEM_PREFIX!r} "
    "(Kubernetes' own classes)",
)
ALLOWED_NAMESPACE = text(
    is_dns1123_label,
    "expected the name of a namespace (DNS-1123 label) whose pods may name the stack's "
    "PriorityClasses without asking for a GPU",
)
VALUE = between(
    LOWEST_PRIORITY,
    HIGHEST_USER_PRIORITY,
    f"expected an integer from {LOWEST_PRIORITY} to {HIGHEST_USER_PRIORITY:,} (higher values "
    "are for Kubernetes' system classes)",
)


class PriorityClassSettings(Settings):
    """One PriorityClass."""

    name: Annotated[str, CLASS_NAME]
    """The PriorityClass name pods give as spec.priorityClassName."""
    value: Annotated[int, VALUE]
    """Its priority: a pending pod may preempt pods of lower value (unless `Never`)."""
    preemption_policy: Annotated[PreemptionPolicy, choice(get_args(PreemptionPolicy))] = (
        "PreemptLowerPriority"
    )
    """PreemptLowerPriority, or Never: queued ahead of lower classes but never evicting them."""
    description: Annotated[str, STRING] = ""
    """What the class is for (shown by kubectl get priorityclass)."""


DEFAULT_CLASSES = (
    PriorityClassSettings(
        name="gpu-inference",
        value=100_000,
        description="GPU serving: may preempt GPU training and batch pods",
    ),
    PriorityClassSettings(
        name="gpu-training",
        value=10_000,
        description="GPU training jobs: may preempt GPU batch pods",
    ),
    PriorityClassSettings(
        name="gpu-batch",
        value=1_000,
        preemption_policy="Never",
        description="GPU batch work: ahead of unclassed pods in the queue, never preempts",
    ),
)


def _names_once(classes: tuple[PriorityClassSettings, ...]) -> tuple[PriorityClassSettings, ...]:
    seen: set[str] = set()
    for i, entry in enumerate(classes):
        if entry.name in seen:
            raise problem("each class name at most once", at=f"[{i}].name", value=entry.name)
        seen.add(entry.name)
    return classes


class GpuPriorityClassesSettings(Settings):
    """PriorityClasses for GPU workloads (the stack config's priorityClasses)."""

    enabled: Annotated[bool, BOOL] = False
    """Create the classes (cluster-scoped objects; none is the cluster's global default)."""
    classes: Annotated[tuple[PriorityClassSettings, ...], AfterValidator(_names_once)] = Field(
        default=DEFAULT_CLASSES
    )
    """The classes: a list of {name, value, preemptionPolicy, description}."""
    allowed_namespaces: Annotated[
        tuple[Annotated[str, ALLOWED_NAMESPACE], ...],
        AfterValidator(unique("each namespace at most once")),
    ] = ()
    """Namespaces whose pods may name the classes without asking for a GPU (say, a serving
    team's CPU front ends). Anywhere else the gate (admission) refuses a pod that names one of
    them but asks for no GPU: a class may preempt other teams' pods."""

    def created_names(self) -> tuple[str, ...]:
        """The names of the classes the stack creates: none when the layer is off."""
        return tuple(entry.name for entry in self.classes) if self.enabled else ()
