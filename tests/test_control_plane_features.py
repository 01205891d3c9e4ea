"""ControlPlaneFeatures under Pulumi mocks, and its host-side shell run for real.

The mock tests check what the program hands pulumi-command: the order of the remote commands,
that the SSH key only travels as a secret, the gates left out for the Kubernetes version, and
that the commands are stable between runs. SSH itself cannot run here (no hosts), so the
`*_host_*` tests run the exact shell library the commands carry with dash and the real editor
on temporary copies of the kubeadm fixtures, with a stand-in for the restart/health step.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components import ControlPlaneFeatures, ControlPlaneFeaturesArgs, RemoteHost, SshAccess
from components.control_plane_features import SCRIPT, host_command, script_sha256
from components.hostscripts.kube_flags_edit import build_argv
from stack_config import ConfigError
from tests.conftest import ROOT, SECRET_SIG, Recording, Registration, register, run_program

COMMAND = "command:remote:Command"
COPY = "command:remote:CopyToRemote"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-test-only\n-----END OPENSSH PRIVATE KEY-----\n"
FIXTURES = ROOT / "tests" / "fixtures" / "kubeadm"

captured: dict[str, Any] = {}


def _host(name: str, last_octet: int) -> RemoteHost:
    return RemoteHost(name=name, address=f"10.0.0.{last_octet}")


def _make_features(**overrides: Any) -> Recording:
    def build() -> None:
        args: dict[str, Any] = {
            "ssh": SshAccess(user="ops", private_key=pulumi.Output.secret(KEY)),
            "control_plane_hosts": [_host("cp-1", 11), _host("cp-2", 12), _host("cp-3", 13)],
            "kubelet_hosts": [_host("gpu-1", 21), _host("gpu-2", 22)],
            "kubernetes_version": "v1.34.4",
            "admission_plugins": ["ExtendedResourceToleration"],
            "feature_gates": {"InPlacePodVerticalScaling": True},
            **overrides,
        }
        features = ControlPlaneFeatures("cpf", ControlPlaneFeaturesArgs(**args))
        features.hosts.apply(lambda v: captured.update(hosts=v))
        features.feature_gates.apply(lambda v: captured.update(feature_gates=v))
        features.skipped_gates.apply(lambda v: captured.update(skipped_gates=v))
        features.admission_plugins.apply(lambda v: captured.update(admission_plugins=v))

    captured.clear()
    return register(build)


def _connection(reg: Registration) -> dict[str, Any]:
    """The (secret-wrapped) connection input, unwrapped."""
    value = reg.inputs["connection"]
    return dict(value["value"] if SECRET_SIG in value else value)


def _chain(recording: Recording) -> list[Registration]:
    """The remote commands in dependency order (each depends on the one before)."""
    commands = recording.of_type(COMMAND)
    by_urn = {c.urn: c for c in commands}
    first = [c for c in commands if not any(d in by_urn for d in c.dependencies)]
    assert len(first) == 1, "exactly one command may start without waiting for another"
    chain = first
    while len(chain) < len(commands):
        nxt = [c for c in commands if chain[-1].urn in c.dependencies]
        assert len(nxt) == 1, f"{chain[-1].name} must be followed by exactly one command"
        chain.append(nxt[0])
    return chain


def test_control_plane_features_edits_control_plane_before_kubelets() -> None:
    names = [c.name for c in _chain(_make_features())]
    assert names == [
        "cpf-apiserver-cp-1",
        "cpf-apiserver-cp-2",
        "cpf-apiserver-cp-3",
        "cpf-kubeadm-config",
        "cpf-kubelet-gpu-1",
        "cpf-kubelet-gpu-2",
        "cpf-kubelet-configmap",
    ]
    assert captured["hosts"] == ["cp-1", "cp-2", "cp-3", "gpu-1", "gpu-2"]


def test_control_plane_features_one_host_at_a_time() -> None:
    recording = _make_features()
    chain = _chain(recording)
    commands = {c.urn for c in chain}
    for previous, current in itertools.pairwise(chain):
        # Waits for the previous command and for nothing else that is a command.
        assert [d for d in current.dependencies if d in commands] == [previous.urn]
    # Each command connects to its own host, after that host received the editor.
    copies = {c.urn: c for c in recording.of_type(COPY)}
    for command in chain:
        (copy_urn,) = [d for d in command.dependencies if d in copies]
        assert copies[copy_urn].inputs["connection"] == command.inputs["connection"]


def test_control_plane_features_private_key_is_secret_in_every_input() -> None:
    recording = _make_features()
    remote = recording.of_type(COMMAND) + recording.of_type(COPY)
    assert len(remote) == 7 + 5
    for reg in remote:
        assert "connection" in reg.secret_inputs, reg.name
        assert _connection(reg)["privateKey"] == KEY
        visible = {k: v for k, v in reg.inputs.items() if k not in reg.secret_inputs}
        assert "PRIVATE KEY" not in json.dumps(visible, default=str)
    assert "PRIVATE KEY" not in json.dumps(captured, default=str)


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_control_plane_features_key_from_config_never_reaches_plain_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # How the CLI tells the program which config values were stored with --secret.
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", '["gpu-cluster:sshPrivateKey"]')
    recording = run_program(
        "prod",
        {
            "sshPrivateKey": KEY,
            "controlPlane": {
                "enabled": True,
                "user": "deploy",
                "hosts": ["cp-1.prod.internal"],
                "admissionPlugins": ["ExtendedResourceToleration"],
            },
        },
    )
    commands = recording.of_type(COMMAND)
    assert commands
    assert all("connection" in c.secret_inputs for c in commands)
    assert {_connection(c)["host"] for c in commands} == {"172.20.0.11"}
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


def test_control_plane_features_without_key_uses_the_ssh_agent() -> None:
    recording = _make_features(ssh=SshAccess(user="ops"))
    for command in recording.of_type(COMMAND):
        assert "privateKey" not in _connection(command)


def test_control_plane_features_leaves_out_ga_gates_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warnings.append(msg))
    recording = _make_features(
        kubernetes_version="v1.35.0",
        feature_gates={"InPlacePodVerticalScaling": True, "PodLevelResources": True},
    )
    assert captured["feature_gates"] == {"PodLevelResources": True}
    assert captured["skipped_gates"] == ["InPlacePodVerticalScaling"]
    assert warnings == [
        "feature gate InPlacePodVerticalScaling is GA and locked on in v1.35; leaving it out"
    ]
    for command in recording.of_type(COMMAND):
        assert "InPlacePodVerticalScaling" not in command.inputs["create"]
    apiserver = recording.named("cpf-apiserver-cp-1").inputs["create"]
    assert "--feature-gates PodLevelResources=true" in apiserver


def test_control_plane_features_commands_are_stable_across_runs() -> None:
    def commands(**overrides: Any) -> dict[str, tuple[str, str, str]]:
        return {
            c.name: (c.inputs["create"], c.inputs["update"], c.inputs["delete"])
            for c in _make_features(**overrides).of_type(COMMAND)
        }

    first, second = commands(), commands()
    assert first == second  # nothing changes, so pulumi runs nothing
    changed = commands(feature_gates={"InPlacePodVerticalScaling": False})
    assert {n for n in first if first[n][0] != changed[n][0]} == {
        "cpf-apiserver-cp-1",
        "cpf-apiserver-cp-2",
        "cpf-apiserver-cp-3",
        "cpf-kubeadm-config",
        "cpf-kubelet-gpu-1",
        "cpf-kubelet-gpu-2",
        "cpf-kubelet-configmap",
    }
    # The editor's hash is in every command, so a new editor version is applied too.
    assert all(script_sha256() in create for create, _, _ in first.values())


def test_control_plane_features_update_converges_in_place_and_delete_reverts() -> None:
    recording = _make_features()
    apiserver = recording.named("cpf-apiserver-cp-2").inputs
    assert apiserver["update"] == apiserver["create"]
    assert "triggers" not in apiserver  # a trigger change would replace, i.e. revert last
    assert (
        "apiserver-manifest revert --file /etc/kubernetes/manifests/kube-apiserver.yaml "
        "--state /var/lib/gpu-cluster/state/kube-apiserver.json" in apiserver["delete"]
    )
    kubeadm = recording.named("cpf-kubeadm-config").inputs
    assert (
        _connection(recording.named("cpf-kubeadm-config"))["host"] == "10.0.0.11"
    )  # the first control-plane host
    assert "kubeadm-config revert" in kubeadm["delete"]
    assert "cm_edit kubeadm-config ClusterConfiguration " in kubeadm["delete"]


def test_control_plane_features_without_persistence_skips_the_configmaps() -> None:
    names = [c.name for c in _chain(_make_features(persist_kubeadm_config=False))]
    assert "cpf-kubeadm-config" not in names
    assert "cpf-kubelet-configmap" not in names


def test_control_plane_features_rejects_a_host_listed_twice() -> None:
    with pytest.raises(ValueError, match=r"control_plane_hosts: got \['cp-1'\] twice"):
        ControlPlaneFeaturesArgs(
            ssh=SshAccess(user="ops"),
            control_plane_hosts=[_host("cp-1", 11), _host("cp-1", 11)],
            kubernetes_version="v1.34.4",
        )


# --------------------------------------------------------------------------- host side


def _host_env(tmp_path: Path) -> dict[str, str]:
    """Paths of a fake host under tmp_path; the editor comes from the repository."""
    manifest = tmp_path / "manifests" / "kube-apiserver.yaml"
    manifest.parent.mkdir()
    manifest.write_bytes((FIXTURES / "v1.34" / "kube-apiserver.yaml").read_bytes())
    return {
        "STAGED": str(SCRIPT),
        "EDIT": str(tmp_path / "bin" / "kube_flags_edit.py"),
        "STATES": str(tmp_path / "state"),
        "BACKUPS": str(tmp_path / "backups"),
        "WORK": str(tmp_path / "work"),
        "MANIFEST": str(manifest),
    }


def _run_host(env: dict[str, str], body: str) -> subprocess.CompletedProcess[str]:
    """Run the library and `body` as the remote command would, minus SSH and sudo."""
    command = host_command(env, body, script_sha256(), timeout=5)
    inner = shlex.split(command.split("$S sh -c ", 1)[1])[0]
    return subprocess.run(["sh", "-c", inner], capture_output=True, text=True, timeout=60)


def _guarded(env: dict[str, str], settle: str, action: str) -> str:
    state = f"{env['STATES']}/kube-apiserver.json"
    kw: dict[str, Any] = {"file": env["MANIFEST"], "state": state, "backup_dir": env["BACKUPS"]}
    if action == "apply":
        kw.update(
            admission_plugins=["ExtendedResourceToleration"],
            feature_gates={"InPlacePodVerticalScaling": True},
            kubernetes_version="v1.34.4",
        )
    argv = shlex.join(build_argv("apiserver-manifest", action, **kw))
    return (
        "settle_ok() { echo settled >&2; }\nsettle_never() { return 1; }\n"
        f"guarded {env['MANIFEST']} {state} {settle} {argv}"
    )


def test_control_plane_features_host_rolls_back_when_not_healthy(tmp_path: Path) -> None:
    env = _host_env(tmp_path)
    original = Path(env["MANIFEST"]).read_bytes()
    result = _run_host(env, _guarded(env, "settle_never", "apply"))
    assert result.returncode == 1
    assert "restoring the previous file" in result.stderr
    assert "rolled back" in result.stderr
    assert Path(env["MANIFEST"]).read_bytes() == original
    assert not Path(env["STATES"], "kube-apiserver.json").exists()
    # The restore is atomic and leaves no file the kubelet would start as a pod.
    assert [p.name for p in Path(env["MANIFEST"]).parent.iterdir()] == ["kube-apiserver.yaml"]


def test_control_plane_features_host_apply_is_idempotent_and_revert_restores(
    tmp_path: Path,
) -> None:
    env = _host_env(tmp_path)
    manifest = Path(env["MANIFEST"])
    original = manifest.read_bytes()

    applied = _run_host(env, _guarded(env, "settle_ok", "apply"))
    assert applied.returncode == 0, applied.stderr
    assert "settled" in applied.stderr
    text = manifest.read_text()
    assert "- --enable-admission-plugins=NodeRestriction,ExtendedResourceToleration\n" in text
    assert "- --feature-gates=InPlacePodVerticalScaling=true\n" in text

    # Unchanged file: the restart/health step is not even attempted.
    again = _run_host(env, _guarded(env, "settle_never", "apply"))
    assert again.returncode == 0, again.stderr
    assert "already as configured" in again.stderr

    reverted = _run_host(env, _guarded(env, "settle_ok", "revert"))
    assert reverted.returncode == 0, reverted.stderr
    assert manifest.read_bytes() == original
    assert not Path(env["STATES"], "kube-apiserver.json").exists()


def test_control_plane_features_host_refuses_an_editor_with_another_hash(tmp_path: Path) -> None:
    env = _host_env(tmp_path)
    tampered = tmp_path / "staged.py"
    tampered.write_bytes(SCRIPT.read_bytes() + b"\n# changed\n")
    env["STAGED"] = str(tampered)
    original = Path(env["MANIFEST"]).read_bytes()
    result = _run_host(env, _guarded(env, "settle_ok", "apply"))
    assert result.returncode == 1
    assert "is not the editor this stack ships" in result.stderr
    assert Path(env["MANIFEST"]).read_bytes() == original


# A stand-in for `kubectl get/patch configmap` (no cluster here): serves one ConfigMap from a JSON
# file and applies a merge patch only when its resourceVersion matches, like the API server.
_FAKE_KUBECTL = r"""#!/usr/bin/env python3
import json, os, sys
store = os.environ["FAKE_CM"]
args = sys.argv[1:]
cm = json.load(open(store))
if "get" in args:
    print(json.dumps(cm))
elif "patch" in args:
    patch = json.load(open(args[args.index("--patch-file") + 1]))
    if patch["metadata"]["resourceVersion"] != cm["metadata"]["resourceVersion"]:
        sys.exit("Error from server (Conflict): the object has been modified")
    cm["data"].update(patch["data"])
    cm["metadata"]["resourceVersion"] = str(int(cm["metadata"]["resourceVersion"]) + 1)
    json.dump(cm, open(store, "w"))
else:
    sys.exit("unexpected: %r" % args)
"""


def _configmap_env(tmp_path: Path, conflict: bool = False) -> tuple[dict[str, str], Path]:
    env = _host_env(tmp_path)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(_FAKE_KUBECTL)
    kubectl.chmod(0o755)
    store = tmp_path / "kubeadm-config.json"
    text = (FIXTURES / "v1.34" / "cluster-configuration.yaml").read_text()
    store.write_text(
        json.dumps(
            {
                "metadata": {"name": "kubeadm-config", "resourceVersion": "100"},
                "data": {"ClusterConfiguration": text},
            }
        )
    )
    if conflict:  # someone else writes between our get and our patch
        kubectl.write_text(
            _FAKE_KUBECTL.replace(
                "print(json.dumps(cm))",
                "print(json.dumps(cm))\n"
                '    cm["metadata"]["resourceVersion"] = "101"; json.dump(cm, open(store, "w"))',
            )
        )
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env["FAKE_CM"] = str(store)
    return env, store


def _cm_body(env: dict[str, str], action: str) -> str:
    files = {
        "file": f"{env['WORK']}/kubeadm-config.in.yaml",
        "out": f"{env['WORK']}/kubeadm-config.out.yaml",
        "state": f"{env['STATES']}/kubeadm-config.json",
    }
    kw: dict[str, Any] = dict(files)
    if action == "apply":
        kw.update(admission_plugins=["ExtendedResourceToleration"], feature_gates={"Foo": True})
    argv = shlex.join(build_argv("kubeadm-config", action, **kw))
    return (
        f"export FAKE_CM={shlex.quote(env['FAKE_CM'])}\n"
        f"cm_edit kubeadm-config ClusterConfiguration {files['file']} {files['out']} "
        f"{files['state']} {argv}"
    )


def test_control_plane_features_host_persists_and_reverts_kubeadm_config(tmp_path: Path) -> None:
    env, store = _configmap_env(tmp_path)
    original = json.loads(store.read_text())["data"]["ClusterConfiguration"]

    applied = _run_host(env, _cm_body(env, "apply"))
    assert applied.returncode == 0, applied.stderr
    cm = json.loads(store.read_text())
    assert cm["metadata"]["resourceVersion"] == "101"
    text = cm["data"]["ClusterConfiguration"]
    assert (
        "name: enable-admission-plugins\n    value: NodeRestriction,ExtendedResourceToleration"
        in text
    )
    assert "name: feature-gates\n    value: Foo=true" in text

    again = _run_host(env, _cm_body(env, "apply"))
    assert again.returncode == 0, again.stderr
    assert "already as configured" in again.stderr
    assert json.loads(store.read_text())["metadata"]["resourceVersion"] == "101"

    reverted = _run_host(env, _cm_body(env, "revert"))
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(store.read_text())["data"]["ClusterConfiguration"] == original


def test_control_plane_features_host_fails_on_a_concurrent_configmap_change(
    tmp_path: Path,
) -> None:
    env, store = _configmap_env(tmp_path, conflict=True)
    original = json.loads(store.read_text())["data"]["ClusterConfiguration"]
    result = _run_host(env, _cm_body(env, "apply"))
    assert result.returncode == 1
    assert "changed meanwhile?" in result.stderr
    assert json.loads(store.read_text())["data"]["ClusterConfiguration"] == original
    # The editor's state is put back too, so the next run starts from the truth.
    assert not Path(env["STATES"], "kubeadm-config.json").exists()


def test_control_plane_features_host_probes_this_api_server_port_and_address(
    tmp_path: Path,
) -> None:
    env = _host_env(tmp_path)
    manifest = Path(env["MANIFEST"])
    result = _run_host(env, "apiserver_readyz_url")
    assert result.stdout.strip() == "https://127.0.0.1:6443/readyz"
    text = manifest.read_text().replace("--secure-port=6443", "--secure-port=7443")
    manifest.write_text(
        text.replace("- --allow-privileged", "- --bind-address=10.1.2.3\n    - --allow-privileged")
    )
    result = _run_host(env, "apiserver_readyz_url")
    assert result.stdout.strip() == "https://10.1.2.3:7443/readyz"
