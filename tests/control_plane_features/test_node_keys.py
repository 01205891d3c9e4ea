"""controlPlane maps keyed by node name: a key the `nodes` inventory lacks is refused at load.

A typo in such a key would pin nothing (the host it meant keeps no pinned key, or the entry is
never read); the problem names the key, the value and the inventory's names, and is reported
with every other problem of the config.
"""

from __future__ import annotations

from typing import Any

import pytest

from stack_config import ConfigError, parse_stack_config

NODES = [
    {"name": "cp-1", "address": "10.0.0.11"},
    {"name": "gpu-1", "address": "10.0.0.21"},
    {"name": "cpu-1"},
]
CP_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC1jcDE root@cp-1"
GPU_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdwdTE root@gpu-1"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA-test-only\n-----END OPENSSH PRIVATE KEY-----\n"


def _parse(**control_plane: Any) -> Any:
    section = {"enabled": True, "user": "ops", "hosts": ["cp-1"], **control_plane}
    return parse_stack_config({"nodes": NODES, "controlPlane": section, "sshPrivateKey": SSH_KEY})


def _problems(**control_plane: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        _parse(**control_plane)
    return [str(p) for p in excinfo.value.problems]


def test_control_plane_node_keys_host_keys_of_inventory_nodes_load() -> None:
    config = _parse(kubeletHosts=["gpu-1"], hostKeys={"cp-1": CP_KEY, "gpu-1": GPU_KEY})
    assert set(config.control_plane.host_keys) == {"cp-1", "gpu-1"}


def test_control_plane_node_keys_host_key_of_a_node_not_in_the_inventory_is_refused() -> None:
    # cp-l for cp-1: without the check the typo pins nothing and cp-1 has no key.
    assert _problems(hostKeys={"cp-1": CP_KEY, "cp-l": CP_KEY}) == [
        "gpu-cluster:controlPlane.hostKeys.cp-l: got 'cp-l'; node is not in gpu-cluster:nodes; "
        "allowed: cp-1, gpu-1, cpu-1"
    ]


def test_control_plane_node_keys_every_unknown_node_is_reported_with_the_other_problems() -> None:
    problems = _problems(hostKeys={"cp-1": CP_KEY, "cp-2": CP_KEY, "gpu-9": GPU_KEY}, port=0)
    assert problems == [
        "gpu-cluster:controlPlane.port: got 0; expected an integer from 1 to 65535",
        "gpu-cluster:controlPlane.hostKeys.cp-2: got 'cp-2'; node is not in gpu-cluster:nodes; "
        "allowed: cp-1, gpu-1, cpu-1",
        "gpu-cluster:controlPlane.hostKeys.gpu-9: got 'gpu-9'; node is not in gpu-cluster:nodes; "
        "allowed: cp-1, gpu-1, cpu-1",
    ]


def test_control_plane_node_keys_an_empty_inventory_says_so() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"controlPlane": {"hostKeys": {"cp-1": CP_KEY}}})
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:controlPlane.hostKeys.cp-1: got 'cp-1'; node is not in gpu-cluster:nodes; "
        "allowed: none listed"
    ]
