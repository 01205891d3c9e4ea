"""The whole program under Pulumi mocks: one definition of a GPU reaches the scheduler's
weights, the gate's GPU names (every engine) and the monitoring, and a NIC that NVIDIA's
Network Operator advertises in the nvidia.com domain reaches none of them as a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.opa_gate.manifests import (
    GATE_CONFIG_FILE,
    GATE_CONFIGMAP,
    gate_list,
)
from tests.conftest import Recording, run_program
from tools.harness.pulumi_engine import project_config

VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
MAP = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicy"
WEBHOOK = "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
ENGINES = ("validating-admission-policy", "mutating-admission-policy", "opa")
# What the Network Operator's device plugins advertise under nvidia.com (tests/test_gpu_resources.py).
NICS = ("nvidia.com/hostdev", "nvidia.com/rdma_shared_device_a", "nvidia.com/sriovlegacy")
GPUS = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "amd.com/gpu")
ADDED = "amd.com/cpx_nps4"


@pytest.fixture(autouse=True)
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """Every program run reads this throwaway kubeconfig, never the developer's."""


def _gate_lists(recording: Recording, engine: str) -> tuple[list[str], list[str]]:
    """The GPU resource names and prefixes the applied gate matches, read from its parameter
    document: OPA's gate.json, or the one written into the native policies. The webhook's
    match condition, which cannot read a parameter, has the same document written in."""
    maps = recording.of_type("kubernetes:core/v1:ConfigMap")
    if engine == "opa":
        (config,) = [r for r in maps if r.inputs["metadata"]["name"] == GATE_CONFIGMAP]
        data = json.loads(config.inputs["data"][GATE_CONFIG_FILE])
        (webhook,) = recording.of_type(WEBHOOK)
        conditions = [
            c["expression"] for w in webhook.inputs["webhooks"] for c in w["matchConditions"]
        ]
        document = json.dumps(data["gpu_resources"])
        assert any(document in e for e in conditions), conditions
    else:
        data = recording.gate_document()
    return gate_list(data, "gpu_resources"), gate_list(data, "gpu_resource_prefixes")


def _gated(lists: tuple[list[str], list[str]], name: str) -> bool:
    names, prefixes = lists
    return name in names or name.startswith(tuple(prefixes))


def _weights(recording: Recording) -> dict[str, int]:
    (profile,) = yaml.safe_load(recording.outputs["schedulerConfig"])["profiles"]
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    return {r["name"]: r["weight"] for r in fit["args"]["scoringStrategy"]["resources"]}


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_resource_names_a_nic_is_no_gpu_to_the_gate(engine: str) -> None:
    """A pod that asks only for a NIC is neither routed nor refused by any engine."""
    lists = _gate_lists(run_program("dev", {"admission": {"engine": engine}}), engine)
    assert [n for n in NICS if _gated(lists, n)] == []
    assert all(_gated(lists, n) for n in GPUS)


def test_gpu_resource_names_a_nic_weight_is_not_the_schedulers_gpu_weight() -> None:
    """The time-sliced GPU the operator advertises is weighted like nvidia.com/gpu, not like a
    NIC the config weighs more."""
    recording = run_program(
        "dev",
        {
            "scheduler": {
                "replicas": 1,
                "resourceWeights": {"nvidia.com/gpu": 10, "nvidia.com/hostdev": 100, "cpu": 1},
            },
            "gpuOperator": _renamed_time_slicing(),
            "gpuPool": _soft_pool(),
        },
    )
    assert _weights(recording) == {
        "nvidia.com/gpu": 10,
        "nvidia.com/hostdev": 100,
        "cpu": 1,
        "nvidia.com/gpu.shared": 10,
    }
    lists = _gate_lists(recording, "validating-admission-policy")
    assert not _gated(lists, "nvidia.com/hostdev")


def _soft_pool() -> dict[str, Any]:
    """dev's pool with a PreferNoSchedule taint: a GPU pod the refusing engines keep on the
    scheduler without a toleration still lands there (no toleration rule to refuse)."""
    pool = dict(project_config("dev")["gpuPool"])
    return {**pool, "taint": {**(pool.get("taint") or {}), "effect": "PreferNoSchedule"}}


def _renamed_time_slicing() -> dict[str, Any]:
    return {
        "enabled": True,
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "devicePlugin": {"timeSlicing": {"replicas": 4, "renameByDefault": True}},
        "mig": {"strategy": "none"},
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_resource_names_an_added_gpu_reaches_scheduler_gate_and_monitoring(
    engine: str,
) -> None:
    recording = run_program(
        "dev",
        {
            "admission": {"engine": engine},
            "scheduler": {"replicas": 1, "gpuResources": [ADDED]},
            "gpuPool": _soft_pool(),
        },
    )
    assert _weights(recording)[ADDED] == 100
    assert _gated(_gate_lists(recording, engine), ADDED)
    (dashboard,) = [
        r
        for r in recording.of_type("kubernetes:core/v1:ConfigMap")
        if r.name == "monitoring-gpu-dashboard"
    ]
    (model,) = [json.loads(v) for v in dashboard.inputs["data"].values()]
    (variable,) = [v for v in model["templating"]["list"] if v["name"] == "gpu_resources"]
    assert "amd_com_cpx_nps4" in variable["query"].split("|")
