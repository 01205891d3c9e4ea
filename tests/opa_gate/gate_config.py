"""The stack config's sections the gate's cross-section rules read, each loaded by its own
model from a stack's config values, for tests/opa_gate/test_tolerations.py and
tests/opa_gate/test_external_operator.py.

The rules are applied by stack_config.py's own pool_toleration_of() and operator_conflict_of()
(re-exported here); loading the sections one by one keeps the other sections' checks apart, so
a test sees the rule's own verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import TypeAdapter

from stack_config import StackConfig, operator_conflict_of, pool_toleration_of

__all__ = ["SECTIONS", "load_sections", "operator_conflict_of", "pool_toleration_of"]


# The sections the gate's cross-section rules read.
SECTIONS = (
    "kubernetes_version",
    "gpu_pool",
    "extended_resources",
    "scheduler",
    "admission",
    "control_plane",
    "gpu_operator",
    "monitoring",
)


def load_sections(values: Mapping[str, Any]) -> StackConfig:
    """A StackConfig whose SECTIONS are each loaded from `values` ({key without namespace:
    value}) by StackConfig's own field for it (its model, rules and default), with no check
    across sections; the other keys keep their defaults."""
    loaded: dict[str, Any] = {}
    for name in SECTIONS:
        info = StackConfig.model_fields[name]
        key = info.alias or name
        if key in values and values[key] is not None:
            field_type: Any = info.annotation
            if info.metadata:
                annotated: Any = Annotated
                field_type = annotated[(field_type, *info.metadata)]
            loaded[name] = TypeAdapter(field_type).validate_python(values[key])
    return StackConfig.model_construct(**loaded)
