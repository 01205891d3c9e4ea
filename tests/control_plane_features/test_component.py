"""ControlPlaneFeatures under Pulumi mocks, and the commands it hands pulumi-command run for real.

The mock tests check the chain (guards, then the kubeadm-config edit, then each control-plane
host, then each kubelet host), that the SSH key only travels as a secret and every host key is
pinned, and that the commands are stable between runs. The `*_host_*` tests take the exact
command strings the component registered and run them with sh on this machine, minus SSH: a
temporary directory stands in for the host's /etc/kubernetes, and `kubeadm`, `systemctl` and
`curl` are recording stand-ins (a real kubeadm needs a kubelet and a cluster for these
phases; tests/integration/test_kubeadm_live.py runs the real binary where it can).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from components import ControlPlaneFeatures, ControlPlaneFeaturesArgs, RemoteHost, SshAccess
from components.cluster_access import ClusterAccess
from stack_config import ConfigError
from tests.conftest import SECRET_SIG, Recording, Registration, register, run_program
from tests.fake_kubeadm_host import INSTANCE_CONFIG, FakeHost, kubelet_config

COMMAND = "command:remote:Command"
KUBEADM_CONFIG = "pulumi-python:dynamic/gpu-cluster:KubeadmConfig"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-test-only\n-----END OPENSSH PRIVATE KEY-----\n"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEq4MWWZYkl1AwbDTXxi4kpYJ5bbhKzzvLyFun5BnLK0"
STACK_ID = "stack-identity-id"
"""The stack's id under the mocks (tests/conftest.py: the StackIdentity resource's id)."""

captured: dict[str, Any] = {}


def _host(name: str, last_octet: int) -> RemoteHost:
    return RemoteHost(name=name, address=f"10.0.0.{last_octet}", host_key=f"{HOST_KEY}{last_octet}")


def _make_features(**overrides: Any) -> Recording:
    def build() -> None:
        # No Kubernetes objects in this component.
        access = ClusterAccess(provider=None)
        args: dict[str, Any] = {
            "access": access,
            "ssh": SshAccess(user="ops", private_key=pulumi.Output.secret(KEY)),
            "control_plane_hosts": [_host("cp-1", 11), _host("cp-2", 12), _host("cp-3", 13)],
            "kubelet_hosts": [_host("gpu-1", 21), _host("gpu-2", 22)],
            "admission_plugins": ["ExtendedResourceToleration"],
            "feature_gates": {"CPUManagerPolicyBetaOptions": True},
            **overrides,
        }
        features = ControlPlaneFeatures("cpf", ControlPlaneFeaturesArgs(**args))
        features.hosts.apply(lambda v: captured.update(hosts=v))
        features.feature_gates.apply(lambda v: captured.update(feature_gates=v))

    captured.clear()
    return register(build)


def _connection(reg: Registration) -> dict[str, Any]:
    """The (secret-wrapped) connection input, unwrapped."""
    value = reg.inputs["connection"]
    return dict(value["value"] if SECRET_SIG in value else value)


def _chain(recording: Recording) -> list[Registration]:
    """The remote commands and the ConfigMap edit in dependency order.

    The step after the last one found is the only step that waits for it and for nothing
    that has not run yet (later commands also read the ConfigMap edit's outputs).
    """
    steps = recording.of_type(COMMAND) + recording.of_type(KUBEADM_CONFIG)
    by_urn = {c.urn: c for c in steps}
    first = [c for c in steps if not any(d in by_urn for d in c.dependencies)]
    assert len(first) == 1, "exactly one step may start without waiting for another"
    chain = first
    while len(chain) < len(steps):
        done = {c.urn for c in chain}
        nxt = [
            c
            for c in steps
            if c.urn not in done
            and chain[-1].urn in c.dependencies
            and {d for d in c.dependencies if d in by_urn} <= done
        ]
        assert len(nxt) == 1, f"{chain[-1].name} must be followed by exactly one step"
        chain.append(nxt[0])
    return chain


def test_control_plane_features_guards_then_configmap_then_control_plane_then_kubelets() -> None:
    names = [c.name for c in _chain(_make_features())]
    assert names == [
        "cpf-guard-cp-1",
        "cpf-guard-cp-2",
        "cpf-guard-cp-3",
        "cpf-kubeadm-config",
        "cpf-control-plane-cp-1",
        "cpf-control-plane-cp-2",
        "cpf-control-plane-cp-3",
        "cpf-kubelet-gpu-1",
        "cpf-kubelet-gpu-2",
    ]
    assert captured["hosts"] == ["cp-1", "cp-2", "cp-3", "gpu-1", "gpu-2"]


def test_control_plane_features_one_host_at_a_time() -> None:
    chain = _chain(_make_features())
    steps = {c.urn for c in chain}
    config = next(c.urn for c in chain if c.typ == KUBEADM_CONFIG)
    for previous, current in itertools.pairwise(chain):
        # Waits for the previous step, and otherwise at most for the ConfigMap edit's outputs.
        waits = {d for d in current.dependencies if d in steps}
        assert previous.urn in waits
        assert waits <= {previous.urn, config}, current.name


def test_control_plane_features_private_key_is_secret_and_host_key_pinned_everywhere() -> None:
    recording = _make_features()
    commands = recording.of_type(COMMAND)
    assert len(commands) == 3 + 3 + 2
    for reg in commands:
        assert "connection" in reg.secret_inputs, reg.name
        connection = _connection(reg)
        assert connection["privateKey"] == KEY
        octet = connection["host"].rsplit(".", 1)[1]
        assert connection["hostKey"] == f"{HOST_KEY}{octet}"
        visible = {k: v for k, v in reg.inputs.items() if k not in reg.secret_inputs}
        assert "PRIVATE KEY" not in json.dumps(visible, default=str)
    assert "PRIVATE KEY" not in json.dumps(captured, default=str)


def test_control_plane_features_configmap_edit_gets_the_stack_and_no_credentials() -> None:
    recording = _make_features()
    (config,) = recording.of_type(KUBEADM_CONFIG)
    # The provider reads the run's credentials from the stack config, never from its inputs.
    assert not {"kubeconfig", "context"} & set(config.inputs)
    # Keyed by the stack's id (kept by `pulumi stack rename`), its name beside it for a reader.
    assert config.inputs["stack"] == STACK_ID
    assert config.inputs["label"].endswith("/gpu-cluster/dev")  # organization/project/stack
    assert config.urn in recording.named("cpf-kubelet-gpu-1").dependencies
    assert config.inputs["admission_plugins"] == ["ExtendedResourceToleration"]
    assert config.inputs["feature_gates"] == {"CPUManagerPolicyBetaOptions": True}


def test_control_plane_features_without_key_uses_the_ssh_agent() -> None:
    recording = _make_features(ssh=SshAccess(user="ops"))
    for command in recording.of_type(COMMAND):
        assert "privateKey" not in _connection(command)


def test_control_plane_features_commands_are_stable_across_runs() -> None:
    def commands(**overrides: Any) -> dict[str, tuple[str, str, str | None]]:
        return {
            c.name: (c.inputs["create"], c.inputs["update"], c.inputs.get("delete"))
            for c in _make_features(**overrides).of_type(COMMAND)
        }

    first, second = commands(), commands()
    assert first == second  # nothing changes, so pulumi runs nothing
    changed = commands(feature_gates={"CPUManagerPolicyBetaOptions": False})
    assert {n for n in first if first[n] != changed[n]} == {
        "cpf-control-plane-cp-1",
        "cpf-control-plane-cp-2",
        "cpf-control-plane-cp-3",
        "cpf-kubelet-gpu-1",
        "cpf-kubelet-gpu-2",
    }


def test_control_plane_features_without_gates_leaves_the_kubelets_alone() -> None:
    names = [c.name for c in _chain(_make_features(feature_gates={}))]
    assert not [n for n in names if "kubelet" in n]
    assert captured["hosts"] == ["cp-1", "cp-2", "cp-3"]


def test_control_plane_features_rejects_a_host_listed_twice() -> None:
    with pytest.raises(ValueError, match=r"control_plane_hosts: got \['cp-1'\] twice"):
        ControlPlaneFeaturesArgs(
            access=None,  # type: ignore[arg-type]
            ssh=SshAccess(user="ops"),
            control_plane_hosts=[_host("cp-1", 11), _host("cp-1", 11)],
        )


def test_control_plane_features_rejects_a_host_without_a_pinned_key() -> None:
    with pytest.raises(ValueError, match=r"kubelet_hosts: \['gpu-1'\] have no host_key"):
        ControlPlaneFeaturesArgs(
            access=None,  # type: ignore[arg-type]
            ssh=SshAccess(user="ops"),
            control_plane_hosts=[_host("cp-1", 11)],
            kubelet_hosts=[RemoteHost(name="gpu-1", address="10.0.0.21", host_key="")],
        )


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_control_plane_features_key_from_config_never_reaches_plain_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # How the CLI tells the program which config values were stored with --secret.
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", '["gpu-cluster:sshPrivateKey"]')
    host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILWtWlM9at+MS9L7Tes5uIP87S+9XBZFTiCkGva0MPDQ"
    recording = run_program(
        "prod",
        {
            "sshPrivateKey": KEY,
            "controlPlane": {
                "enabled": True,
                "user": "deploy",
                "hosts": ["cp-1.prod.internal"],
                "hostKeys": {"cp-1.prod.internal": f"{host_key} root@cp-1"},
                "admissionPlugins": ["ExtendedResourceToleration"],
            },
        },
    )
    commands = recording.of_type(COMMAND)
    assert commands
    assert all("connection" in c.secret_inputs for c in commands)
    assert {_connection(c)["host"] for c in commands} == {"172.20.0.11"}
    assert {_connection(c)["hostKey"] for c in commands} == {host_key}
    assert recording.named("control-plane-kubeadm-config").inputs["stack"] == STACK_ID
    assert recording.outputs["controlPlaneHosts"] == ["cp-1.prod.internal"]
    assert "PRIVATE KEY" not in json.dumps(recording.outputs, default=str)


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_control_plane_features_refuses_a_key_stored_in_plain_text() -> None:
    recording = Recording()
    overrides = {
        "sshPrivateKey": KEY,
        "controlPlane": {"enabled": True, "user": "deploy", "hosts": ["cp-1.prod.internal"]},
    }
    with pytest.raises(ConfigError, match=r"sshPrivateKey: got '\[plain text, not shown\]'"):
        run_program("prod", overrides, recording)
    assert recording.resources == []


# --------------------------------------------------------------------------- host side


def registered_commands(host: FakeHost, **overrides: Any) -> dict[str, Registration]:
    """The remote commands the component registers, by name, with the host's state dir."""
    overrides.setdefault("ready_timeout_seconds", 2)
    recording = _make_features(state_dir=str(host.state), **overrides)
    return {c.name: c for c in recording.of_type(COMMAND)}


def test_control_plane_features_host_guard_passes_a_manifest_kubeadm_would_render(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    result = host.run(registered_commands(host)["cpf-guard-cp-1"].inputs["create"])
    assert result.returncode == 0, result.stderr
    assert "match kubeadm's rendering" in result.stderr
    # Only the dry run: nothing is written on the check.
    assert host.kubeadm_calls() == [
        "kubeadm upgrade node phase control-plane --dry-run --etcd-upgrade=false --certificate-renewal=false"
    ]


def test_control_plane_features_host_refuses_hand_edits_naming_them(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.set_manifests(
        host.manifests,
        {
            "kube-apiserver": ("--enable-admission-plugins=NodeRestriction,PodNodeSelector",),
            "kube-scheduler": ("--profiling=false",),
        },
    )
    before = {p.name: p.read_text() for p in host.manifests.iterdir()}
    result = host.run(registered_commands(host)["cpf-control-plane-cp-1"].inputs["create"])
    assert result.returncode == 1
    assert "refusing: regenerating with kubeadm would drop these hand edits" in result.stderr
    assert (
        f"{host.manifests}/kube-apiserver.yaml:\n--enable-admission-plugins item PodNodeSelector"
        in result.stderr
    )
    assert "    - --profiling=false" in result.stderr
    assert "kube-controller-manager.yaml" not in result.stderr
    # Refused after the dry run, before kubeadm wrote anything.
    assert host.kubeadm_calls() == [
        "kubeadm upgrade node phase control-plane --dry-run --etcd-upgrade=false "
        "--certificate-renewal=false"
    ]
    assert {p.name: p.read_text() for p in host.manifests.iterdir()} == before


def test_control_plane_features_host_regenerates_with_kubeadm_and_records_its_items(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    # The ConfigMap now carries the stack's change: kubeadm renders the new flags.
    new_flags = (
        "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",
        "--feature-gates=CPUManagerPolicyBetaOptions=true",
    )
    host.set_manifests(host.render, {"kube-apiserver": new_flags})
    result = host.run(registered_commands(host)["cpf-control-plane-cp-1"].inputs["create"])
    assert result.returncode == 0, result.stderr
    assert host.kubeadm_calls()[-1] == (
        "kubeadm upgrade node phase control-plane --etcd-upgrade=false --certificate-renewal=false"
    )
    assert "--feature-gates=CPUManagerPolicyBetaOptions=true" in (
        (host.manifests / "kube-apiserver.yaml").read_text()
    )
    recorded = (host.state / STACK_ID / "control-plane-items").read_text().split()
    assert recorded == ["CPUManagerPolicyBetaOptions", "ExtendedResourceToleration"]


def test_control_plane_features_host_destroy_regenerates_without_the_stacks_items(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    commands = registered_commands(host)
    with_flags = {
        "kube-apiserver": (
            "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",
            "--feature-gates=CPUManagerPolicyBetaOptions=true",
        )
    }
    host.set_manifests(host.render, with_flags)
    assert host.run(commands["cpf-control-plane-cp-1"].inputs["create"]).returncode == 0
    # The ConfigMap is back to what it was; the guard's delete regenerates from it. The
    # stack's own items are expected to go; nothing else is in the way.
    host.set_manifests(
        host.render, {"kube-apiserver": ("--enable-admission-plugins=NodeRestriction",)}
    )
    result = host.run(commands["cpf-guard-cp-1"].inputs["delete"])
    assert result.returncode == 0, result.stderr
    text = (host.manifests / "kube-apiserver.yaml").read_text()
    assert "ExtendedResourceToleration" not in text
    assert "feature-gates" not in text
    assert not (host.state / STACK_ID).exists()


def test_control_plane_features_host_replaced_guard_keeps_the_record_while_kubeadm_renders_it(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    commands = registered_commands(host)
    with_plugin = {
        "kube-apiserver": ("--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",)
    }
    host.set_manifests(host.render, with_plugin)
    assert host.run(commands["cpf-control-plane-cp-1"].inputs["create"]).returncode == 0
    # A guard replaced (new host key, say) runs its delete while the ConfigMap is unchanged.
    replaced = host.run(commands["cpf-guard-cp-1"].inputs["delete"])
    assert replaced.returncode == 0, replaced.stderr
    record = host.state / STACK_ID / "control-plane-items"
    assert "ExtendedResourceToleration" in record.read_text().split()
    # So the real destroy later still knows the plugin was the stack's, not a hand edit.
    host.set_manifests(
        host.render, {"kube-apiserver": ("--enable-admission-plugins=NodeRestriction",)}
    )
    destroyed = host.run(commands["cpf-guard-cp-1"].inputs["delete"])
    assert destroyed.returncode == 0, destroyed.stderr
    assert not record.exists()


def test_control_plane_features_host_kubelet_without_gates_to_set_writes_no_patch(
    tmp_path: Path,
) -> None:
    # Every gate GA at its value: the ConfigMap edit reports no gates to set.
    host = FakeHost(tmp_path)
    command = registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"]
    empty = command.replace("GATES=CPUManagerPolicyBetaOptions=true", "GATES=''")
    assert empty != command
    result = host.run(empty)
    assert result.returncode == 0, result.stderr
    assert not (host.state / STACK_ID).exists()
    # kubeadm's dry run finds the kubelet as it would leave it: no phase, no restart.
    assert host.kubeadm_calls() == ["kubeadm upgrade node phase kubelet-config --dry-run"]
    assert "systemctl" not in host.calls.read_text()


GATE = {"CPUManagerPolicyBetaOptions": True}
"""The gate `_make_features` asks for."""
NODE_SETTINGS = {
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0-1",
    "maxPods": 250,
    "topologyManagerPolicy": "single-numa-node",
}
"""Per-node kubelet settings common on GPU nodes, in neither the ConfigMap nor a patch."""


def test_control_plane_features_host_kubelet_patch_per_node_and_removal(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs
    result = host.run(kubelet["create"])
    assert result.returncode == 0, result.stderr
    patches = host.state / STACK_ID / "patches"
    assert (patches / "kubeletconfiguration+strategic.yaml").read_text() == (
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "featureGates:\n  CPUManagerPolicyBetaOptions: true\n"
    )
    # kubeadm's dry run first (what the kubelet would get), then the phase itself.
    work = f"{host.state}/.kubelet.XXXXXX"
    assert host.kubeadm_calls() == [
        f"kubeadm upgrade node phase kubelet-config --patches {work}/patches --dry-run",
        f"kubeadm upgrade node phase kubelet-config --patches {work}/patches",
    ]
    assert "systemctl restart kubelet" in host.calls.read_text()
    assert host.kubelet_settings()["featureGates"] == GATE
    assert host.kubelet_config.read_text() == kubelet_config({"featureGates": GATE})

    removed = host.run(kubelet["delete"])
    assert removed.returncode == 0, removed.stderr
    assert not (host.state / STACK_ID).exists()
    assert host.kubeadm_calls()[-1] == "kubeadm upgrade node phase kubelet-config"
    assert host.kubelet_config.read_text() == kubelet_config()
    assert [p.name for p in host.state.iterdir()] == []  # no work directory left behind


def test_control_plane_features_host_kubelet_rerun_with_the_gates_on_the_kubelet_changes_nothing(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs
    assert host.run(kubelet["create"]).returncode == 0
    restarts = host.calls.read_text().count("systemctl restart kubelet")

    again = host.run(kubelet["update"])
    assert again.returncode == 0, again.stderr
    assert "kubelet already runs with this configuration" in again.stderr
    assert host.kubeadm_calls()[-1].endswith(" --dry-run")
    assert host.calls.read_text().count("systemctl restart kubelet") == restarts


def test_control_plane_features_host_unhealthy_kubelet_gets_its_old_config_back(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    before = host.kubelet_config.read_text()
    host.health.write_text("not ok")
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 1
    assert "kubelet not healthy within 2s" in result.stderr
    assert host.kubelet_config.read_text() == before
    assert host.calls.read_text().count("systemctl restart kubelet") == 2
    # The host says what the kubelet runs with: no patch of this stack.
    assert not (host.state / STACK_ID).exists()


def test_control_plane_features_host_kubelet_rerun_after_a_rollback_fails_again(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    create = registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"]
    host.health.write_text("not ok")  # the gate keeps the kubelet from coming up
    assert host.run(create).returncode == 1

    # pulumi runs the failed command again on the next `up`.
    again = host.run(create)
    assert again.returncode == 1, again.stderr
    assert "kubelet not healthy within 2s" in again.stderr
    assert "featureGates" not in host.kubelet_settings()


def test_control_plane_features_host_kubelet_rerun_after_a_rollback_sets_the_gates(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    create = registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"]
    host.health.write_text("not ok")
    assert host.run(create).returncode == 1

    host.health.write_text("ok")  # fixed on the node (or a slow start the first time)
    again = host.run(create)
    assert again.returncode == 0, again.stderr
    assert host.kubelet_settings()["featureGates"] == GATE


def test_control_plane_features_host_kubelet_failed_removal_is_done_by_the_next_destroy(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs
    assert host.run(kubelet["create"]).returncode == 0
    host.health.write_text("not ok")
    failed = host.run(kubelet["delete"])
    assert failed.returncode == 1
    assert host.kubelet_settings()["featureGates"] == GATE  # rolled back, gates still on

    host.health.write_text("ok")
    removed = host.run(kubelet["delete"])
    assert removed.returncode == 0, removed.stderr
    assert "featureGates" not in host.kubelet_settings()
    assert not (host.state / STACK_ID).exists()


def test_control_plane_features_host_kubelet_removal_takes_the_gates_out_without_the_patch(
    tmp_path: Path,
) -> None:
    # A host where the patch is gone but the kubelet still runs with the gates (an earlier
    # version removed the patch before a removal that was rolled back).
    host = FakeHost(tmp_path)
    host.kubelet_config.write_text(kubelet_config({"featureGates": GATE}))
    removed = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["delete"])
    assert removed.returncode == 0, removed.stderr
    assert "featureGates" not in host.kubelet_settings()


def test_control_plane_features_host_kubelet_refuses_node_settings_kubeadm_would_drop(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.kubelet_config.write_text(kubelet_config(NODE_SETTINGS))
    before = host.kubelet_config.read_text()
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 1
    assert (
        f"refusing: kubeadm would drop these settings of {host.kubelet_config}, which are in "
        "neither the kubelet-config ConfigMap, a stack's patch nor "
        f"{host.instance_config}" in result.stderr
    )
    for line in (
        "  cpuManagerPolicy: static (kubeadm would write nothing)",
        "  maxPods: 250 (kubeadm would write nothing)",
        "  reservedSystemCPUs: 0-1 (kubeadm would write nothing)",
        "  topologyManagerPolicy: single-numa-node (kubeadm would write nothing)",
    ):
        assert line in result.stderr
    # Only kubeadm's dry run: nothing written, no restart, no patch left claiming the gate.
    assert [c.split(" --")[0] for c in host.kubeadm_calls()] == [
        "kubeadm upgrade node phase kubelet-config"
    ]
    assert "--dry-run" in host.kubeadm_calls()[0]
    assert "systemctl" not in host.calls.read_text()
    assert host.kubelet_config.read_text() == before
    assert not (host.state / STACK_ID).exists()


def test_control_plane_features_host_kubelet_names_a_setting_kubeadm_would_change(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.kubelet_config.write_text(kubelet_config({"clusterDNS": ["10.96.0.53"]}))
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 1
    assert "  clusterDNS[0]: 10.96.0.53 (kubeadm would write 10.96.0.10)" in result.stderr


def test_control_plane_features_host_kubelet_keeps_node_settings_of_the_instance_config(
    tmp_path: Path,
) -> None:
    # What the refusal asks for: the node's settings where kubeadm applies them itself.
    host = FakeHost(tmp_path)
    instance = INSTANCE_CONFIG + yaml.safe_dump(NODE_SETTINGS)
    host.instance_config.write_text(instance)
    host.kubelet_config.write_text(kubelet_config(instance=instance))
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 0, result.stderr
    settings = host.kubelet_settings()
    assert {k: settings[k] for k in NODE_SETTINGS} == NODE_SETTINGS
    assert settings["featureGates"] == GATE


def test_control_plane_features_host_kubelet_keeps_another_stacks_gates(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    other = {"KubeletPodResourcesDynamicResources": True}
    host.add_kubelet_patch("prod", other)
    host.kubelet_config.write_text(kubelet_config({"featureGates": other}))
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs

    result = host.run(kubelet["create"])
    assert result.returncode == 0, result.stderr
    assert host.kubelet_settings()["featureGates"] == {**other, **GATE}

    removed = host.run(kubelet["delete"])
    assert removed.returncode == 0, removed.stderr
    assert host.kubelet_settings()["featureGates"] == other
    assert (host.state / "prod" / "patches").is_dir()


def test_control_plane_features_host_kubelet_gate_two_stacks_want_stays_until_both_are_gone(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.add_kubelet_patch("prod", GATE)
    host.kubelet_config.write_text(kubelet_config({"featureGates": GATE}))
    kubelet = registered_commands(host)["cpf-kubelet-gpu-1"].inputs
    assert host.run(kubelet["create"]).returncode == 0

    removed = host.run(kubelet["delete"])
    assert removed.returncode == 0, removed.stderr
    assert host.kubelet_settings()["featureGates"] == GATE  # prod still wants it


def test_control_plane_features_host_kubelet_refuses_a_gate_another_stack_sets_otherwise(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.add_kubelet_patch("prod", {"CPUManagerPolicyBetaOptions": False})
    host.kubelet_config.write_text(
        kubelet_config({"featureGates": {"CPUManagerPolicyBetaOptions": False}})
    )
    before = host.kubelet_config.read_text()
    result = host.run(registered_commands(host)["cpf-kubelet-gpu-1"].inputs["create"])
    assert result.returncode == 1
    assert (
        "refusing: the stacks on this host want different values for kubelet feature gates:\n"
        f"  CPUManagerPolicyBetaOptions: false (stack prod), true (stack {STACK_ID})"
        in result.stderr
    )
    assert host.kubeadm_calls() == []
    assert host.kubelet_config.read_text() == before
    assert not (host.state / STACK_ID).exists()


def test_control_plane_features_a_renamed_host_keeps_its_commands_through_aliases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renaming a host in the inventory moves its commands over (no delete over SSH on the
    old name, which may no longer resolve); the other hosts' commands have no alias."""
    import components.control_plane_features.component as module

    aliases: dict[str, list[str]] = {}
    original = module.remote.Command

    def spy(resource_name: str, *args: Any, **kwargs: Any) -> Any:
        opts = kwargs.get("opts")
        aliases[resource_name] = [str(a.name) for a in (opts.aliases or [])] if opts else []
        return original(resource_name, *args, **kwargs)

    monkeypatch.setattr(module.remote, "Command", spy)
    renamed = RemoteHost(
        name="gpu-a", address="10.0.0.21", host_key=f"{HOST_KEY}21", previous_names=("gpu-1",)
    )
    _make_features(kubelet_hosts=[renamed, _host("gpu-2", 22)])
    assert aliases["cpf-kubelet-gpu-a"] == ["cpf-kubelet-gpu-1"]
    assert aliases["cpf-kubelet-gpu-2"] == []
    assert all(v == [] for k, v in aliases.items() if not k.endswith("gpu-a"))


def test_control_plane_features_previous_names_come_from_the_inventory() -> None:
    from stack_config import parse_stack_config

    config = parse_stack_config(
        {
            "nodes": [{"name": "gpu-a", "address": "10.0.0.21", "previousNames": ["gpu-1"]}],
        }
    )
    (node,) = config.nodes
    assert node.previous_names == ("gpu-1",)


def test_control_plane_features_a_previous_name_that_is_still_a_node_is_refused() -> None:
    from stack_config import parse_stack_config

    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {
                "nodes": [
                    {"name": "gpu-a", "address": "10.0.0.21", "previousNames": ["gpu-b"]},
                    {"name": "gpu-b", "address": "10.0.0.22"},
                ]
            }
        )
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:nodes[0].previousNames[0]: got 'gpu-b'; a previous name must not be a node "
        "of the inventory (its commands would be claimed twice)"
    ]


def test_control_plane_features_host_leaves_its_own_api_versions_and_refuses_others(
    tmp_path: Path,
) -> None:
    """--runtime-config is checked like the plugins and gates: the stack's own API versions in
    a live manifest are no hand edit, anyone else's that kubeadm would drop is refused."""
    host = FakeHost(tmp_path)
    host.set_manifests(
        host.manifests,
        {"kube-apiserver": ("--runtime-config=scheduling.k8s.io/v1beta1=true,batch/v9=true",)},
    )
    commands = registered_commands(host, runtime_config={"scheduling.k8s.io/v1beta1": True})
    result = host.run(commands["cpf-control-plane-cp-1"].inputs["create"])
    assert result.returncode == 1
    assert "--runtime-config item batch/v9=true" in result.stderr
    assert "scheduling.k8s.io/v1beta1" not in result.stderr
