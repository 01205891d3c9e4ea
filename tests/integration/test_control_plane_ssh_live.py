"""The registered remote commands over a real SSH session, with the host key verified.

An OpenSSH sshd (Debian's openssh-server; `.ci/run` installs it when missing) listens on
127.0.0.1 with a host key made for the test; the OpenSSH client connects with
StrictHostKeyChecking=yes and a known_hosts holding only the key from the stack's
`hostKeys`, the way pulumi-command is given `connection.hostKey`. The command strings
ControlPlaneFeatures registered run in the order of the chain, each as the remote shell's
command, on the `FakeHost` of tests/test_control_plane_features.py (kubeadm, systemctl and
curl are recording stand-ins: the phases need a kubelet). pulumi-command itself is not run:
its plugin cannot be built here (tools/README.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_kubeadm_host import FakeHost
from tests.test_control_plane_features import registered_commands
from tools.harness import free_port

SSHD = Path("/usr/sbin/sshd")


class Sshd:
    """sshd on 127.0.0.1 with its own host key, accepting one client key for root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.port = free_port()
        self.host_key = root / "ssh_host_ed25519_key"
        self.client_key = root / "client_key"
        for key in (self.host_key, self.client_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        (root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        config = root / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        self.log = (root / "sshd.log").open("w")
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=self.log, stderr=self.log
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["ssh-keyscan", "-p", str(self.port), "127.0.0.1"], capture_output=True, text=True
            )
            if "ssh-ed25519" in probe.stdout:
                return
            time.sleep(0.2)
        raise RuntimeError(f"sshd did not start: {(self.root / 'sshd.log').read_text()}")

    def public_host_key(self) -> str:
        return " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])

    def run(
        self, command: str, pinned: str, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """`command` as the remote shell's command, connecting only to the `pinned` key."""
        known_hosts = self.root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{self.port} {pinned}\n")
        exports = " ".join(f"export {k}={v};" for k, v in env.items())
        argv = [
            "ssh",
            "-p",
            str(self.port),
            "-i",
            str(self.client_key),
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "root@127.0.0.1",
            f"{exports} {command}",
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if os.geteuid() != 0:
        pytest.skip("sshd must run as root to log a user in")
    if not SSHD.exists() or not shutil.which("ssh"):
        reason = "openssh-server and openssh-client are needed (apt-get install openssh-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    server = Sshd(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()


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
