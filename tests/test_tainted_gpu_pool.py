"""TaintedGpuPool under Pulumi mocks: children, values handed to the providers, outputs."""

from __future__ import annotations

from typing import Any

from components import ClusterAccess, Taint, TaintedGpuPool, TaintedGpuPoolArgs
from tests.conftest import Recording, register

TAINT_TYPE = "pulumi-python:dynamic/gpu-cluster:NodeTaint"
PATCH_TYPE = "kubernetes:core/v1:NodePatch"

captured: dict[str, Any] = {}


def _make_pool(**overrides: Any) -> Recording:
    def build() -> None:
        access = ClusterAccess.create("cluster", "apiVersion: v1\nkind: Config\n", None)
        args: dict[str, Any] = {"access": access, "nodes": ["gpu-1", "gpu-2"], **overrides}
        pool = TaintedGpuPool("pool", TaintedGpuPoolArgs(**args))
        pool.taint.apply(lambda t: captured.update(taint=t))
        pool.nodes.apply(lambda n: captured.update(nodes=n))
        pool.toleration.apply(lambda t: captured.update(toleration=t))

    captured.clear()
    return register(build)


def test_tainted_gpu_pool_taints_each_node_with_the_default_taint() -> None:
    recording = _make_pool()
    taints = recording.of_type(TAINT_TYPE)
    assert sorted((t.name, t.inputs["node"]) for t in taints) == [
        ("pool-taint-gpu-1", "gpu-1"),
        ("pool-taint-gpu-2", "gpu-2"),
    ]
    for taint in taints:
        assert (taint.inputs["key"], taint.inputs["value"], taint.inputs["effect"]) == (
            "nvidia.com/gpu",
            "present",
            "NoSchedule",
        )


def test_tainted_gpu_pool_keeps_credentials_out_of_its_resources() -> None:
    recording = _make_pool()
    for taint in recording.of_type(TAINT_TYPE):
        assert not {"kubeconfig", "context"} & set(taint.inputs)
        assert "__provider" in taint.secret_inputs


def test_tainted_gpu_pool_children_are_parented_to_the_component() -> None:
    recording = _make_pool(labels={"gpu-cluster.io/pool": "gpu"})
    component = recording.named("pool")
    assert component.typ == "gpu-cluster:index:TaintedGpuPool"
    children = recording.of_type(TAINT_TYPE) + recording.of_type(PATCH_TYPE)
    assert len(children) == 4
    assert all(c.parent == component.urn for c in children)


def test_tainted_gpu_pool_labels_use_node_patch_with_the_explicit_provider() -> None:
    recording = _make_pool(labels={"gpu-cluster.io/pool": "gpu"})
    provider = recording.named("cluster")
    patches = recording.of_type(PATCH_TYPE)
    assert sorted((p.inputs["metadata"] for p in patches), key=lambda m: m["name"]) == [
        {"name": "gpu-1", "labels": {"gpu-cluster.io/pool": "gpu"}},
        {"name": "gpu-2", "labels": {"gpu-cluster.io/pool": "gpu"}},
    ]
    assert all(p.provider.startswith(provider.urn + "::") for p in patches)


def test_tainted_gpu_pool_without_labels_patches_no_labels() -> None:
    recording = _make_pool(labels={})
    assert recording.of_type(PATCH_TYPE) == []


def test_tainted_gpu_pool_custom_taint_reaches_provider_and_outputs() -> None:
    taint = Taint(key="example.com/gpu", value="", effect="PreferNoSchedule")
    recording = _make_pool(taint=taint)
    assert {t.inputs["effect"] for t in recording.of_type(TAINT_TYPE)} == {"PreferNoSchedule"}
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
