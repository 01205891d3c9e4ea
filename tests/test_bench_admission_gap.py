"""bench.admission_gap's pure parts: the variants' objects and what a run's samples measure."""

from __future__ import annotations

import pytest

from bench.admission_gap import (
    FIELDS,
    SCHEDULER,
    VARIANTS,
    Row,
    Sample,
    _objects,
    _reason,
    measure,
    table,
)
from components.opa_gate.manifests import ALLOCATION_POLICY, CLAIM_KINDS, claim_policy_name


def _param_kinds(variant: str) -> dict[str, dict[str, str] | None]:
    return {
        f"{collection}/{name}": spec.get("paramKind")
        for collection, name, spec in _objects(variant)
        if collection.endswith("policies")
    }


def test_admission_gap_baseline_reads_a_configmap_parameter() -> None:
    assert list(_param_kinds("configmap-param").values()) == [
        {"apiVersion": "v1", "kind": "ConfigMap"}
    ]


def test_admission_gap_the_stack_has_no_parameter_in_device_plugin_mode() -> None:
    assert list(_param_kinds("stack").values()) == [None, None]


def test_admission_gap_the_dra_stack_looks_up_claims_only_in_its_claim_policies() -> None:
    kinds = _param_kinds("stack-dra")
    looked_up = {name for name, kind in kinds.items() if kind is not None}
    assert looked_up == {
        f"{collection}/{claim_policy_name(k)}"
        for k in CLAIM_KINDS
        for collection in ("validatingadmissionpolicies", "mutatingadmissionpolicies")
    }
    assert f"validatingadmissionpolicies/{ALLOCATION_POLICY}" in kinds


def test_admission_gap_measures_what_happened_once_the_server_answered_again() -> None:
    samples = [
        Sample(0.5, gpu=False, status=201, scheduler="default-scheduler"),  # before the stop
        Sample(1.0, gpu=False, status=0),  # stopped
        Sample(1.5, gpu=True, status=0),
        Sample(2.0, gpu=False, status=403, message="x denied request: not yet synced"),
        Sample(2.5, gpu=True, status=201, scheduler="default-scheduler"),
        Sample(3.0, gpu=False, status=201, scheduler="default-scheduler"),
        Sample(3.5, gpu=False, status=500, message="late"),
        Sample(4.0, gpu=True, status=201, scheduler=SCHEDULER),
    ]
    row = measure(samples, "stack", 10, down=0.8, ready=3.2)
    assert row == Row(
        variant="stack",
        configmaps=10,
        unreachable_s=1.0,
        cpu_refused=2,
        cpu_refused_window_s=1.5,
        cpu_refused_after_ready=1,
        cpu_admitted=1,
        gpu_unrouted=1,
        first_error="not yet synced",
    )


def test_admission_gap_baseline_routes_nothing_so_reports_no_unrouted_gpu() -> None:
    samples = [Sample(1.0, gpu=True, status=0), Sample(2.0, gpu=True, status=201)]
    assert measure(samples, "configmap-param", 0, down=0.5, ready=2.0).gpu_unrouted == 0


def test_admission_gap_reason_keeps_what_follows_the_policy_name() -> None:
    message = "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'b' with binding 'b' denied request: failed"
    assert _reason(message) == "failed"


@pytest.mark.parametrize("variant", VARIANTS)
def test_admission_gap_table_has_a_column_per_field(variant: str) -> None:
    row = Row(variant, 0, 1.0, 0, 0.0, 0, 5, 0, "")
    header, rule, line = table([row]).splitlines()
    assert header.count("|") == rule.count("|") == line.count("|") == len(FIELDS) + 1
    assert line.startswith(f"| {variant} |")
