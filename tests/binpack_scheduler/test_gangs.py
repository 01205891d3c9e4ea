"""scheduler.gangScheduling: what the stack's scheduler runs with, what the control plane is
asked for, and what the config refuses before anything is applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.binpack_scheduler.manifests import GANG_RULES, SCHEDULER_RULES
from components.binpack_scheduler.settings import (
    GANG_FEATURE_GATE,
    GANG_GROUP_VERSION,
    BinpackSchedulerSettings,
)
from stack_config import ConfigError, parse_stack_config
from tests.conftest import run_program

V1_37 = "v1.37.2"
KUBEADM_CONFIG = "pulumi-python:dynamic/gpu-cluster:KubeadmConfig"
CP_NODES = [{"name": "cp-1", "address": "10.0.0.11"}]
HOST_KEYS = {"cp-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ1x test-only"}


@pytest.fixture(autouse=True)
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """Every program run reads this throwaway kubeconfig, never the developer's."""


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(values)
    return [str(p) for p in excinfo.value.problems]


def _control_plane(**fields: Any) -> dict[str, Any]:
    section = {"enabled": True, "user": "ops", "hosts": ["cp-1"], "hostKeys": HOST_KEYS}
    return {
        "nodes": CP_NODES,
        "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n",
        "controlPlane": {**section, **fields},
        "scheduler": {"gangScheduling": True},
    }


def test_gangs_are_off_by_default_and_ask_nothing_of_the_control_plane() -> None:
    settings = parse_stack_config({}).scheduler
    assert settings.gang_scheduling is False
    assert settings.profile.feature_gates == {}
    assert not settings.control_plane_needs.key


def test_gangs_need_the_generic_workload_gate_and_podgroups_of_v1beta1() -> None:
    needs = BinpackSchedulerSettings(gang_scheduling=True).control_plane_needs
    assert needs.key == "scheduler.gangScheduling"
    assert needs.feature_gates == {GANG_FEATURE_GATE: True}
    assert needs.runtime_config == {GANG_GROUP_VERSION: True}


@pytest.mark.parametrize("version", ["v1.35.4", "v1.36.3"])
def test_gangs_on_an_older_minor_are_refused_with_the_reason(version: str) -> None:
    values = {
        "kubernetesVersion": version,
        "admission": {"engine": "validating-admission-policy"},
        "scheduler": {"gangScheduling": True},
    }
    (found,) = _problems(values)
    assert found.startswith("gpu-cluster:scheduler.gangScheduling: got True; needs ")
    assert f"kubernetesVersion is {version}" in found


def test_a_gate_set_off_by_hand_against_gangs_is_refused() -> None:
    (found,) = _problems(_control_plane(featureGates={GANG_FEATURE_GATE: False}))
    assert found == (
        f"gpu-cluster:controlPlane.featureGates.{GANG_FEATURE_GATE}: got False; "
        "scheduler.gangScheduling needs true (the stack sets it; remove the key, or turn "
        "scheduler.gangScheduling off)"
    )


def test_a_malformed_runtime_config_key_is_refused() -> None:
    (found,) = _problems(_control_plane(runtimeConfig={"scheduling/v1beta1": True}))
    assert found.startswith("gpu-cluster:controlPlane.runtimeConfig.scheduling/v1beta1: ")
    assert "expected an API group/version" in found


@pytest.mark.parametrize("scoring", ["binpack", "fragmentation"])
def test_the_scheduler_runs_with_the_gate_and_may_read_podgroups(scoring: str) -> None:
    scheduler: dict[str, Any] = {"gangScheduling": True, "scoring": scoring}
    if scoring == "fragmentation":
        scheduler["image"] = "registry.example.com/gpu-binpack-scheduler:v1.37.2"
    recording = run_program("dev", {"scheduler": scheduler, "kubernetesVersion": V1_37})
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    (container,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert f"--feature-gates={GANG_FEATURE_GATE}=true" in container["command"]
    roles = [
        r
        for r in recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
        if r.inputs["metadata"]["name"].endswith(":scheduler")
    ]
    (role,) = roles
    assert role.inputs["rules"] == [dict(r) for r in (*SCHEDULER_RULES, *GANG_RULES)]


def test_without_gangs_the_scheduler_has_no_gate_and_no_podgroup_rule() -> None:
    recording = run_program("dev")
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    (container,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert not any(c.startswith("--feature-gates") for c in container["command"])
    config = yaml.safe_load(
        next(
            r for r in recording.of_type("kubernetes:core/v1:ConfigMap") if "config" in r.name
        ).inputs["data"]["config.yaml"]
    )
    assert config["kind"] == "KubeSchedulerConfiguration"


def test_with_the_control_plane_on_the_stack_turns_on_what_gangs_need() -> None:
    recording = run_program(
        "dev", {"scheduler": {"gangScheduling": True}, "kubernetesVersion": V1_37}
    )
    (kubeadm,) = recording.of_type(KUBEADM_CONFIG)
    assert kubeadm.inputs["feature_gates"][GANG_FEATURE_GATE] is True
    assert kubeadm.inputs["runtime_config"] == {GANG_GROUP_VERSION: True}


def test_without_gangs_the_kubeadm_inputs_stay_as_they_were() -> None:
    (kubeadm,) = run_program("dev").of_type(KUBEADM_CONFIG)
    assert "runtime_config" not in kubeadm.inputs
    assert GANG_FEATURE_GATE not in kubeadm.inputs["feature_gates"]


def test_the_gate_keeps_every_pod_of_a_podgroup_on_the_stacks_scheduler_only_with_gangs() -> None:
    def params(recording: Any) -> dict[str, str]:
        return dict(recording.gate_document())

    on = run_program("dev", {"scheduler": {"gangScheduling": True}, "kubernetesVersion": V1_37})
    assert params(on)["gang_pods"] == "true"
    assert "gang_pods" not in params(run_program("dev"))


def test_with_gangs_the_scheduler_waits_for_the_control_planes_rollout() -> None:
    # The API servers serve PodGroups only once ControlPlaneFeatures has rolled them out.
    def waits_for_the_control_plane(recording: Any) -> bool:
        # The SDK records a dependency on a component as one on each of its children.
        (scheduler,) = recording.of_type("gpu-cluster:index:BinpackScheduler")
        return any("gpu-cluster:index:ControlPlaneFeatures$" in d for d in scheduler.dependencies)

    on = run_program("dev", {"scheduler": {"gangScheduling": True}, "kubernetesVersion": V1_37})
    assert waits_for_the_control_plane(on)
    assert not waits_for_the_control_plane(run_program("dev"))


def test_gang_namespaces_limit_the_podgroups_the_gate_keeps() -> None:
    scheduler = {"gangScheduling": True, "gangNamespaces": ["ml-train", "ml-batch"]}
    recording = run_program("dev", {"scheduler": scheduler, "kubernetesVersion": V1_37})
    assert recording.gate_document()["gang_namespaces"] == "ml-batch,ml-train"
    every = run_program("dev", {"scheduler": {"gangScheduling": True}, "kubernetesVersion": V1_37})
    assert "gang_namespaces" not in every.gate_document()


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        (
            {"gangNamespaces": ["ml-train"]},
            "gpu-cluster:scheduler.gangNamespaces: got ['ml-train']; gangNamespaces says whose "
            "PodGroups the stack's scheduler places, which it does only with "
            "scheduler.gangScheduling true: set it, or leave gangNamespaces empty",
        ),
        (
            {"gangScheduling": True, "gangNamespaces": ["ml-train", "ml-train"]},
            "gpu-cluster:scheduler.gangNamespaces[1]: got 'ml-train'; each namespace at most once",
        ),
        (
            {"gangScheduling": True, "gangNamespaces": ["ML_train"]},
            "gpu-cluster:scheduler.gangNamespaces[0]: got 'ML_train'; expected the name of a "
            "namespace (DNS-1123 label) whose PodGroups the stack's scheduler places",
        ),
    ],
)
def test_gang_namespaces_are_checked_at_load(scheduler: dict[str, Any], expected: str) -> None:
    problems = _problems({"scheduler": scheduler, "kubernetesVersion": V1_37})
    assert expected in problems, problems
