"""TaintedGpuPool under Pulumi mocks: one node-set resource, values handed to it, outputs."""

from __future__ import annotations

from typing import Any

import pytest

from components import Taint, TaintedGpuPool, TaintedGpuPoolArgs
from tests.conftest import UNREACHABLE_PREFIX, Recording, component_access, register

POOL_TYPE = "pulumi-python:dynamic/gpu-cluster:GpuPoolNodes"

captured: dict[str, Any] = {}


def _make_pool(**overrides: Any) -> Recording:
    def build() -> None:
        access = component_access()
        args: dict[str, Any] = {"access": access, "nodes": ["gpu-1", "gpu-2"], **overrides}
        pool = TaintedGpuPool("pool", TaintedGpuPoolArgs(**args))
        pool.taint.apply(lambda t: captured.update(taint=t))
        pool.nodes.apply(lambda n: captured.update(nodes=n))
        pool.toleration.apply(lambda t: captured.update(toleration=t))
        pool.labels.apply(lambda labels: captured.update(labels=labels))

    captured.clear()
    return register(build)


def test_tainted_gpu_pool_is_one_resource_for_every_node_with_the_default_taint() -> None:
    recording = _make_pool(nodes=[f"gpu-{i}" for i in range(50)])
    (pool,) = recording.of_type(POOL_TYPE)
    assert pool.inputs["nodes"] == [f"gpu-{i}" for i in range(50)]
    assert (pool.inputs["key"], pool.inputs["value"], pool.inputs["effect"]) == (
        "nvidia.com/gpu",
        "present",
        "NoSchedule",
    )
    assert [r.typ for r in recording.resources].count(POOL_TYPE) == 1


def test_tainted_gpu_pool_keeps_credentials_out_of_its_resources() -> None:
    (pool,) = _make_pool().of_type(POOL_TYPE)
    assert not {"kubeconfig", "context"} & set(pool.inputs)
    assert "__provider" in pool.secret_inputs


def test_tainted_gpu_pool_children_are_parented_to_the_component() -> None:
    recording = _make_pool()
    component = recording.named("pool")
    assert component.typ == "gpu-cluster:index:TaintedGpuPool"
    (pool,) = recording.of_type(POOL_TYPE)
    assert pool.parent == component.urn


def test_tainted_gpu_pool_labels_reach_the_node_set_and_outputs() -> None:
    recording = _make_pool(labels={"gpu-cluster.io/pool": "gpu", "team": "ml"})
    (pool,) = recording.of_type(POOL_TYPE)
    assert pool.inputs["labels"] == {"gpu-cluster.io/pool": "gpu", "team": "ml"}
    assert captured["labels"] == {"gpu-cluster.io/pool": "gpu", "team": "ml"}
    assert recording.of_type("kubernetes:core/v1:NodePatch") == []


def test_tainted_gpu_pool_custom_taint_reaches_provider_and_outputs() -> None:
    taint = Taint(key="example.com/gpu", value="", effect="PreferNoSchedule")
    recording = _make_pool(taint=taint)
    (pool,) = recording.of_type(POOL_TYPE)
    assert pool.inputs["effect"] == "PreferNoSchedule"
    assert captured["taint"] == {
        "key": "example.com/gpu",
        "value": "",
        "effect": "PreferNoSchedule",
    }
    assert captured["toleration"] == {
        "key": "example.com/gpu",
        "operator": "Equal",
        "value": "",
        "effect": "PreferNoSchedule",
    }


def test_tainted_gpu_pool_outputs_nodes_and_taint() -> None:
    _make_pool()
    assert captured["nodes"] == ["gpu-1", "gpu-2"]
    assert captured["taint"] == {
        "key": "nvidia.com/gpu",
        "value": "present",
        "effect": "NoSchedule",
    }


def test_tainted_gpu_pool_fails_naming_every_failed_node_and_withholds_its_outputs() -> None:
    bad = [f"{UNREACHABLE_PREFIX}7", f"{UNREACHABLE_PREFIX}3"]
    with pytest.raises(Exception, match=r"2 of 5 nodes failed") as failure:
        _make_pool(nodes=["gpu-1", bad[0], "gpu-2", bad[1], "gpu-3"])
    message = str(failure.value)
    assert all(f"{node}: cannot patch node '{node}'" in message for node in bad)
    assert "gpu-1" not in message
    assert "taint" not in captured  # later layers never see a half-tainted pool as done
