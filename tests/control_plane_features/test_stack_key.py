"""ControlPlaneFeatures keys what it leaves on the hosts by the stack's id, and adopts what an
earlier version keyed by the stack's name.

The commands are the ones the component registers under Pulumi mocks, with KubeadmConfig's
`former` output (the names its state held) as the real provider sets it; they run with sh on a
`FakeHost` (tests/fake_kubeadm_host.py: kubeadm, systemctl and curl are recording stand-ins).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Mocks
from tests.control_plane_features.test_component import (
    GATE,
    KUBEADM_CONFIG,
    STACK_ID,
    registered_commands,
)
from tests.fake_kubeadm_host import FakeHost, kubelet_config

FORMER = "dev"
"""The stack's name, which an earlier version keyed its host directory and record by."""
OLD_GATE = {"KubeletPodResourcesDynamicResources": True}
"""A gate the earlier version set and the stack no longer wants."""


@pytest.fixture
def former(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """KubeadmConfig's outputs name FORMER, as after an `up` of a state the earlier version
    left (components/control_plane_features/provider.py, former_keys)."""
    original = Mocks.new_resource

    def new_resource(self: Mocks, args: Any) -> tuple[str, dict[str, Any]]:
        id_, outputs = original(self, args)
        if args.typ == KUBEADM_CONFIG:
            outputs["former"] = [FORMER]
        return id_, outputs

    monkeypatch.setattr(Mocks, "new_resource", new_resource)
    yield


def _earlier_version_left(host: FakeHost, gates: dict[str, bool]) -> None:
    """The host as the earlier version left it: its patch under the stack's name, the kubelet
    running with it."""
    host.add_kubelet_patch(FORMER, gates)
    host.kubelet_config.write_text(kubelet_config({"featureGates": gates}))


def test_control_plane_stack_key_host_directory_is_the_stack_id(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 0, result.stderr
    assert [p.name for p in host.state.iterdir()] == [STACK_ID]


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_kubelet_adopts_the_patch_kept_under_the_stack_name(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    _earlier_version_left(host, GATE)
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["update"])
    assert result.returncode == 0, result.stderr
    assert f"adopted {host.state}/{FORMER}" in result.stderr
    assert [p.name for p in host.state.iterdir()] == [STACK_ID]
    assert host.kubelet_settings()["featureGates"] == GATE
    # The same gates: kubeadm's dry run only, no restart.
    assert "systemctl" not in host.calls.read_text()


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_kubelet_takes_out_a_gate_only_the_adopted_patch_had(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    _earlier_version_left(host, {**GATE, **OLD_GATE})
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["update"])
    assert result.returncode == 0, result.stderr
    assert host.kubelet_settings()["featureGates"] == GATE
    patch = host.state / STACK_ID / "patches" / "kubeletconfiguration+strategic.yaml"
    assert "KubeletPodResourcesDynamicResources" not in patch.read_text()
    assert not (host.state / FORMER).exists()


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_destroy_removes_the_adopted_patch_too(tmp_path: Path) -> None:
    # A host the upgrade's `up` never reached (it failed before), then `pulumi destroy`.
    host = FakeHost(tmp_path)
    _earlier_version_left(host, {**GATE, **OLD_GATE})
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["delete"])
    assert result.returncode == 0, result.stderr
    assert "featureGates" not in host.kubelet_settings()
    assert [p.name for p in host.state.iterdir()] == []


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_another_stacks_directory_is_left_alone(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    other = {"KubeletPodResourcesDynamicResources": True}
    host.add_kubelet_patch("prod", other)
    _earlier_version_left(host, GATE)
    host.kubelet_config.write_text(kubelet_config({"featureGates": {**GATE, **other}}))
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs
    assert host.run(kubelet["update"]).returncode == 0
    removed = host.run(kubelet["delete"])
    assert removed.returncode == 0, removed.stderr
    assert host.kubelet_settings()["featureGates"] == other
    assert sorted(p.name for p in host.state.iterdir()) == ["prod"]


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_control_plane_adopts_the_record_of_its_items(
    tmp_path: Path,
) -> None:
    # The earlier version added ExtendedResourceToleration; the stack no longer wants it, the
    # ConfigMap no longer has it, so kubeadm renders the manifest without it.
    host = FakeHost(tmp_path)
    live = ("--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",)
    host.set_manifests(host.manifests, {"kube-apiserver": live})
    (host.state / FORMER).mkdir(parents=True)
    (host.state / FORMER / "control-plane-items").write_text("ExtendedResourceToleration\n")
    commands = registered_commands(host, admission_plugins=[])
    result = host.run(commands["cpf-control-plane-cp-1"].inputs["update"])
    assert result.returncode == 0, result.stderr
    assert "ExtendedResourceToleration" not in (host.manifests / "kube-apiserver.yaml").read_text()
    assert not (host.state / FORMER).exists()
    # The stack's gate stays recorded under its id; the plugin, gone from the manifest, not.
    items = (host.state / STACK_ID / "control-plane-items").read_text().split()
    assert items == ["CPUManagerPolicyBetaOptions"]


@pytest.mark.usefixtures("former")
def test_control_plane_stack_key_adopting_leaves_files_it_did_not_write(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    _earlier_version_left(host, GATE)
    (host.state / FORMER / "notes.txt").write_text("an operator's\n")
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["update"])
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (host.state / FORMER).iterdir()] == ["notes.txt"]
    assert f"left {host.state}/{FORMER}: it holds files this script did not write" in result.stderr
