"""The registered remote commands over a real SSH session, with the host key verified.

An OpenSSH sshd (Debian's openssh-server; `.ci/run` installs it when missing) listens on
127.0.0.1 with a host key made for the test; the OpenSSH client connects with
StrictHostKeyChecking=yes and a known_hosts holding only the key from the stack's
`hostKeys`, the way pulumi-command is given `connection.hostKey`. The command strings
ControlPlaneFeatures registered run in the order of the chain, each as the remote shell's
command, on the `FakeHost` of tests/control_plane_features/test_component.py (kubeadm, systemctl and
curl are recording stand-ins: the phases need a kubelet). pulumi-command itself is not run:
its plugin cannot be built here (tools/README.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.control_plane_features.test_component import registered_commands
from tests.fake_kubeadm_host import FakeHost
from tests.integration.conftest import Sshd


def test_control_plane_ssh_live_chain_runs_over_ssh_with_the_pinned_host_key(
    tmp_path: Path, sshd: Sshd
) -> None:
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    commands = registered_commands(host)
    env = host.env()
    pinned = sshd.public_host_key()
    new_flags = ("--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",)
    steps = [
        ("cpf-guard-cp-1", "create"),
        ("cpf-control-plane-cp-1", "create"),
        ("cpf-kubelet-gpu-1", "create"),
        ("cpf-kubelet-gpu-1", "delete"),
        ("cpf-guard-cp-1", "delete"),
    ]
    for name, which in steps:
        if name == "cpf-control-plane-cp-1":  # the ConfigMap now carries the plugin
            host.set_manifests(host.render, {"kube-apiserver": new_flags})
        if (name, which) == ("cpf-guard-cp-1", "delete"):  # and after destroy, no longer
            host.set_manifests(
                host.render, {"kube-apiserver": ("--enable-admission-plugins=NodeRestriction",)}
            )
        result = sshd.run(commands[name].inputs[which], pinned, env)
        assert result.returncode == 0, f"{name} {which}: {result.stderr}"
    assert host.kubeadm_calls() == [
        "kubeadm upgrade node phase control-plane --dry-run --etcd-upgrade=false --certificate-renewal=false",
        "kubeadm upgrade node phase control-plane --dry-run --etcd-upgrade=false --certificate-renewal=false",
        "kubeadm upgrade node phase control-plane --etcd-upgrade=false --certificate-renewal=false",
        f"kubeadm upgrade node phase kubelet-config --patches {host.state}/.kubelet.XXXXXX/patches --dry-run",
        f"kubeadm upgrade node phase kubelet-config --patches {host.state}/.kubelet.XXXXXX/patches",
        "kubeadm upgrade node phase kubelet-config --dry-run",
        "kubeadm upgrade node phase kubelet-config",
        "kubeadm upgrade node phase control-plane --dry-run --etcd-upgrade=false --certificate-renewal=false",
        "kubeadm upgrade node phase control-plane --etcd-upgrade=false --certificate-renewal=false",
    ]
    assert "ExtendedResourceToleration" not in (host.manifests / "kube-apiserver.yaml").read_text()


def test_control_plane_ssh_live_another_host_key_is_refused_before_anything_runs(
    tmp_path: Path, sshd: Sshd
) -> None:
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    command = registered_commands(host)["cpf-guard-cp-1"].inputs["create"]
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    result = sshd.run(command, wrong, host.env())
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
    assert host.calls.read_text() == ""
