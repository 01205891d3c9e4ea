"""The stack config's sections the gate's cross-section rules read, each loaded by its own
model from a stack's config values, for tests/test_gate_tolerations.py and
tests/test_gate_external_operator.py.

The rules themselves (components/opa_gate_settings.py) are applied here exactly as
stack_config.py applies them to a loaded StackConfig; loading the sections one by one keeps
the other sections' checks apart, so a test sees the rule's own verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import TypeAdapter

from components.binpack_scheduler_settings import BinpackSchedulerSettings
from components.control_plane_settings import ControlPlaneSettings
from components.gpu_operator_settings import GpuOperatorSettings
from components.monitoring_stack_settings import MonitoringStackSettings
from components.opa_gate_settings import (
    OpaGateSettings,
    operator_conflict_problem,
    pool_resources,
    pool_toleration_problem,
)
from components.settings import Problem
from components.tainted_gpu_pool import TaintedGpuPoolSettings
from stack_config import StackConfig


@dataclass(frozen=True)
class Sections:
    """What the gate's rules read from a stack config."""

    kubernetes_version: str
    gpu_pool: TaintedGpuPoolSettings
    extended_resources: Mapping[str, Mapping[str, int]]
    scheduler: BinpackSchedulerSettings
    admission: OpaGateSettings
    control_plane: ControlPlaneSettings
    gpu_operator: GpuOperatorSettings
    monitoring: MonitoringStackSettings


def load_sections(values: Mapping[str, Any]) -> Sections:
    """Each section of `values` ({key without namespace: value}) loaded by StackConfig's own
    field for it (its model, rules and default)."""
    loaded: dict[str, Any] = {}
    for name in Sections.__dataclass_fields__:
        info = StackConfig.model_fields[name]
        key = info.alias or name
        if key in values and values[key] is not None:
            field_type: Any = info.annotation
            if info.metadata:
                annotated: Any = Annotated
                field_type = annotated[(field_type, *info.metadata)]
            loaded[name] = TypeAdapter(field_type).validate_python(values[key])
        else:
            loaded[name] = info.get_default(call_default_factory=True)
    return Sections(**loaded)


def pool_toleration_of(config: Sections | StackConfig) -> Problem | None:
    """pool_toleration_problem() as stack_config.py applies it."""
    names, prefixes = pool_resources(
        config.scheduler.gpu_resources_with(config.gpu_operator.gpu_resources()),
        config.extended_resources,
        config.gpu_pool.nodes,
        gate_extended_resources=config.admission.gate_extended_resources,
    )
    return pool_toleration_problem(
        engine=config.admission.engine,
        kubernetes_version=config.kubernetes_version,
        admission_plugins=(
            config.control_plane.admission_plugins if config.control_plane.enabled else ()
        ),
        taint=config.gpu_pool.taint.as_dict(),
        names=names,
        prefixes=prefixes,
    )


def operator_conflict_of(config: Sections | StackConfig) -> Problem | None:
    """operator_conflict_problem() as stack_config.py applies it."""
    monitoring = config.monitoring
    return operator_conflict_problem(
        external_namespace=config.admission.external_gpu_operator_namespace,
        operator_enabled=config.gpu_operator.enabled,
        operator_namespace=config.gpu_operator.namespace,
        created_namespaces=(
            {monitoring.namespace: "monitoring.namespace"}
            if monitoring.enabled and monitoring.create_namespace
            else {}
        ),
    )
