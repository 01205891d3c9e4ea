"""The PriorityClass objects of GpuPriorityClasses, as pure functions of the settings."""

from __future__ import annotations

from typing import Any

from components.gpu_priority_classes.settings import PriorityClassSettings
from components.object_meta import PART_OF, object_meta


def priority_class(entry: PriorityClassSettings) -> dict[str, Any]:
    """A scheduling.k8s.io/v1 PriorityClass; never the global default."""
    return {
        "metadata": object_meta(entry.name, labels=PART_OF),
        "value": entry.value,
        "global_default": False,
        "preemption_policy": entry.preemption_policy,
        "description": entry.description or None,
    }
