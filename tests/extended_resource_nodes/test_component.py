"""ExtendedResourceNodes under Pulumi mocks."""

from __future__ import annotations

from typing import Any

import pytest

from components import ExtendedResourceNodes, ExtendedResourceNodesArgs
from tests.conftest import UNREACHABLE_PREFIX, Recording, component_access, register

RESOURCE_TYPE = "pulumi-python:dynamic/gpu-cluster:ExtendedResourceNodeSet"
DONGLES = {"example.com/fpga": 1, "example.com/dongle": 4}
captured: dict[str, Any] = {}


def _make_nodes(**overrides: Any) -> Recording:
    def build() -> None:
        access = component_access("lab")
        args: dict[str, Any] = {
            "access": access,
            "nodes": {"worker-2": {"example.com/nic": 2}, "worker-1": DONGLES},
            **overrides,
        }
        nodes = ExtendedResourceNodes("extended", ExtendedResourceNodesArgs(**args))
        nodes.resources.apply(lambda r: captured.update(resources=r))

    captured.clear()
    return register(build)


def test_extended_resource_nodes_declare_one_resource_for_every_node() -> None:
    recording = _make_nodes()
    (advertised,) = recording.of_type(RESOURCE_TYPE)
    assert advertised.name == "extended-nodes"
    assert advertised.inputs["nodes"] == {
        "worker-1": {"example.com/dongle": 4, "example.com/fpga": 1},
        "worker-2": {"example.com/nic": 2},
    }


def test_extended_resource_nodes_keep_credentials_out_of_their_resource() -> None:
    """The provider reads them from the stack config at run time; nothing lands in state."""
    (advertised,) = _make_nodes().of_type(RESOURCE_TYPE)
    assert not {"kubeconfig", "context"} & set(advertised.inputs)


def test_extended_resource_nodes_child_is_parented_to_the_component() -> None:
    recording = _make_nodes()
    component = recording.named("extended")
    assert component.typ == "gpu-cluster:index:ExtendedResourceNodes"
    assert all(r.parent == component.urn for r in recording.of_type(RESOURCE_TYPE))


def test_extended_resource_nodes_output_advertised_counts_per_node() -> None:
    _make_nodes()
    assert captured["resources"] == {
        "worker-1": {"example.com/dongle": 4, "example.com/fpga": 1},
        "worker-2": {"example.com/nic": 2},
    }


def test_extended_resource_nodes_fail_naming_every_failed_node() -> None:
    nodes = {
        f"{UNREACHABLE_PREFIX}b": DONGLES,
        "worker-1": DONGLES,
        f"{UNREACHABLE_PREFIX}a": DONGLES,
    }
    with pytest.raises(Exception, match=r"2 of 3 nodes failed") as failure:
        _make_nodes(nodes=nodes)
    message = str(failure.value)
    assert f"{UNREACHABLE_PREFIX}a: " in message and f"{UNREACHABLE_PREFIX}b: " in message
    assert "resources" not in captured
