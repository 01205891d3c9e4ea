"""GpuPriorityClasses under Pulumi mocks, alone and in the whole program."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import GpuPriorityClasses, GpuPriorityClassesArgs
from components.gpu_priority_classes.settings import DEFAULT_CLASSES
from components.ownership import OwnershipError
from tests.conftest import component_access, register, run_program
from tests.fake_cluster import monitoring_ready_cluster

PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"


@pytest.fixture(autouse=True)
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """Every program run reads this throwaway kubeconfig, never the developer's."""


def test_priority_classes_one_object_each_never_the_global_default() -> None:
    def build() -> None:
        GpuPriorityClasses(
            "priority-classes",
            GpuPriorityClassesArgs(enabled=True, access=component_access()),
        )

    recording = register(build)
    created = {r.inputs["metadata"]["name"]: r for r in recording.of_type(PRIORITY_CLASS)}
    assert sorted(created) == sorted(c.name for c in DEFAULT_CLASSES)
    for entry in DEFAULT_CLASSES:
        resource = created[entry.name]
        assert resource.inputs["value"] == entry.value
        assert resource.inputs["preemptionPolicy"] == entry.preemption_policy
        assert resource.inputs["globalDefault"] is False
        assert resource.inputs["metadata"]["labels"] == {"app.kubernetes.io/part-of": "gpu-cluster"}
        assert "namespace" not in resource.inputs["metadata"]


def test_priority_classes_in_the_program_only_when_enabled() -> None:
    off = run_program("dev")
    assert not off.of_type(PRIORITY_CLASS)
    on = run_program("dev", {"priorityClasses": {"enabled": True}})
    assert len(on.of_type(PRIORITY_CLASS)) == len(DEFAULT_CLASSES)
    assert on.outputs["gpuPriorityClasses"] == [c.name for c in DEFAULT_CLASSES]


def test_priority_classes_an_existing_class_of_the_name_is_refused_naming_the_section() -> None:
    cluster = monitoring_ready_cluster()
    cluster.add(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "gpu-training"},
            "value": 7,
        }
    )
    with pytest.raises(OwnershipError, match=r"gpu-cluster:priorityClasses: .*gpu-training"):
        run_program("dev", {"priorityClasses": {"enabled": True}}, cluster=cluster)
