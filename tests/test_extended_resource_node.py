"""ExtendedResourceNode under Pulumi mocks."""

from __future__ import annotations

from typing import Any

from components import ClusterAccess, ExtendedResourceNode, ExtendedResourceNodeArgs
from tests.conftest import Recording, register

RESOURCE_TYPE = "pulumi-python:dynamic/gpu-cluster:ExtendedResource"
captured: dict[str, Any] = {}


def _make_node(**overrides: Any) -> Recording:
    def build() -> None:
        access = ClusterAccess.create("cluster", "apiVersion: v1\nkind: Config\n", "lab")
        args: dict[str, Any] = {
            "access": access,
            "node": "worker-1",
            "resources": {"example.com/dongle": 4, "example.com/fpga": 1},
            **overrides,
        }
        node = ExtendedResourceNode("worker-1", ExtendedResourceNodeArgs(**args))
        node.resources.apply(lambda r: captured.update(resources=r))

    captured.clear()
    return register(build)


def test_extended_resource_node_declares_one_resource_per_entry() -> None:
    recording = _make_node()
    resources = recording.of_type(RESOURCE_TYPE)
    assert sorted((r.name, r.inputs["resource"], r.inputs["quantity"]) for r in resources) == [
        ("worker-1-example.com-dongle", "example.com/dongle", 4),
        ("worker-1-example.com-fpga", "example.com/fpga", 1),
    ]
    assert {r.inputs["node"] for r in resources} == {"worker-1"}


def test_extended_resource_node_keeps_credentials_out_of_its_resources() -> None:
    """The provider reads them from the stack config at run time; nothing lands in state."""
    recording = _make_node()
    for resource in recording.of_type(RESOURCE_TYPE):
        assert not {"kubeconfig", "context"} & set(resource.inputs)


def test_extended_resource_node_children_are_parented_to_the_component() -> None:
    recording = _make_node()
    component = recording.named("worker-1")
    assert component.typ == "gpu-cluster:index:ExtendedResourceNode"
    assert all(r.parent == component.urn for r in recording.of_type(RESOURCE_TYPE))


def test_extended_resource_node_outputs_advertised_counts() -> None:
    _make_node()
    assert captured["resources"] == {"example.com/dongle": 4, "example.com/fpga": 1}
