"""The commands ControlPlaneFeatures runs on its hosts (components/control_plane_features/commands.py).

Plain strings, no Pulumi: what each step hands kubeadm.sh. The script itself runs against a
fake host in tests/control_plane_features/test_component.py and over SSH in the integration tests.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from components.control_plane_features.commands import (
    SCRIPT,
    control_plane_command,
    gate_items,
    guard_commands,
    host_command,
    kubelet_command,
    stack_directory,
)

AS_ROOT = 'if [ "$(id -u)" -eq 0 ]; then S=""; else S="sudo -n"; fi; '


def _call(command: str) -> tuple[dict[str, str], str]:
    """(the variables, the action) of a host_command line."""
    assert command.startswith(AS_ROOT)
    words = shlex.split(command.removeprefix(AS_ROOT))
    assert words[:2] == ["$S", "env"]
    sh = words.index("sh")
    assert words[sh + 1 :] == ["-c", SCRIPT.read_text(), "kubeadm.sh", words[-1]]
    return dict(w.split("=", 1) for w in words[2:sh]), words[-1]


@pytest.mark.parametrize(
    ("action", "variables"),
    [
        ("check", {"STACK_DIR": "/etc/kubernetes/gpu-cluster/dev"}),
        ("kubelet", {"STACK_DIR": "/s", "TIMEOUT": 300, "GATES": "A=true"}),
        ("control-plane", {"STACK_DIR": "/s", "OURS": "A B", "CONFIG": "0123"}),
        ("check", {"STACK_DIR": "/odd dir/it's"}),
    ],
)
def test_host_command_runs_the_script_as_root_with_its_variables(
    action: str, variables: dict[str, Any]
) -> None:
    assert _call(host_command(action, variables)) == (
        {k: str(v) for k, v in variables.items()},
        action,
    )


@pytest.mark.parametrize(
    ("gates", "items"),
    [
        ({}, ""),
        ({"A": True}, "A=true"),
        ({"B": False, "A": True}, "A=true,B=false"),
    ],
)
def test_gate_items_sorted_as_feature_gates_spells_them(gates: dict[str, bool], items: str) -> None:
    assert gate_items(gates) == items


@pytest.mark.parametrize(
    ("state_dir", "stack", "directory"),
    [
        ("/etc/kubernetes/gpu-cluster", "dev", "/etc/kubernetes/gpu-cluster/dev"),
        ("/etc/kubernetes/gpu-cluster/", "prod", "/etc/kubernetes/gpu-cluster/prod"),
        ("/", "a.b", "/a.b"),
    ],
)
def test_stack_directory_is_one_per_stack(state_dir: str, stack: str, directory: str) -> None:
    assert stack_directory(state_dir, stack) == directory


@pytest.mark.parametrize("stack", ["../etc", "a/b", "", ".hidden"])
def test_stack_directory_refuses_a_key_that_is_not_one_directory_name(stack: str) -> None:
    with pytest.raises(ValueError, match=r"stack key: got .*; expected a stack id or name"):
        stack_directory("/etc/kubernetes/gpu-cluster", stack)


def test_commands_name_the_former_directories_only_when_there_are_some() -> None:
    plain = control_plane_command("/s/id", ["P"], {}, {})
    assert "FORMER" not in _call(plain)[0]
    assert "FORMER" not in _call(kubelet_command("kubelet", "/s/id", 300, {"A": True}))[0]
    variables, _ = _call(control_plane_command("/s/id", ["P"], {}, {}, ["dev", "a.b", "dev"]))
    assert variables["FORMER"] == "a.b dev"
    variables, _ = _call(kubelet_command("kubelet-remove", "/s/id", 300, {}, ["dev"]))
    assert variables["FORMER"] == "dev"
    with pytest.raises(ValueError, match=r"stack key: got '\.\./x'"):
        kubelet_command("kubelet", "/s/id", 300, {}, ["../x"])


def test_guard_checks_on_create_and_regenerates_on_delete() -> None:
    create, delete = guard_commands("/s/dev")
    assert _call(create) == ({"STACK_DIR": "/s/dev"}, "check")
    assert _call(delete) == ({"STACK_DIR": "/s/dev"}, "control-plane")


@pytest.mark.parametrize(
    ("plugins", "gates", "ours"),
    [
        (["ExtendedResourceToleration"], {}, "ExtendedResourceToleration"),
        ([], {"B": True, "A": False}, "A B"),
        (["P"], {"P": True, "G": True}, "G P"),
    ],
)
def test_control_plane_command_names_the_stacks_items(
    plugins: list[str], gates: dict[str, bool], ours: str
) -> None:
    variables, action = _call(control_plane_command("/s/dev", plugins, gates, {}))
    assert action == "control-plane"
    assert variables["STACK_DIR"] == "/s/dev"
    assert variables["OURS"] == ours
    assert len(variables["CONFIG"]) == 16


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((["P"], {}, {}), (["P", "Q"], {}, {})),
        ((["P"], {"G": True}, {}), (["P"], {"G": False}, {})),
        ((["P"], {}, {}), (["P"], {}, {"apiServer": {"enable-admission-plugins": {"P": None}}})),
    ],
)
def test_control_plane_command_changes_with_what_the_configmap_carries(
    before: tuple[Any, Any, Any], after: tuple[Any, Any, Any]
) -> None:
    assert control_plane_command("/s", *before) != control_plane_command("/s", *after)
    assert control_plane_command("/s", *before) == control_plane_command("/s", *before)


@pytest.mark.parametrize("action", ["kubelet", "kubelet-remove"])
def test_kubelet_command_hands_over_the_gates_and_the_timeout(action: str) -> None:
    variables, called = _call(kubelet_command(action, "/s/dev", 300, {"B": False, "A": True}))
    assert called == action
    assert variables == {"STACK_DIR": "/s/dev", "TIMEOUT": "300", "GATES": "A=true,B=false"}


def test_control_plane_command_names_the_api_versions_and_reruns_when_they_change() -> None:
    plain = control_plane_command("/s", ["P"], {"G": True}, {})
    versions = {"scheduling.k8s.io/v1beta1": True}
    with_versions = control_plane_command("/s", ["P"], {"G": True}, {}, (), versions)
    assert _call(with_versions)[0]["OURS"] == "G P scheduling.k8s.io/v1beta1"
    assert _call(with_versions)[0]["CONFIG"] != _call(plain)[0]["CONFIG"]
    # None set: the command, digest included, is what it was before API versions were known.
    assert control_plane_command("/s", ["P"], {"G": True}, {}, (), {}) == plain
