"""ControlPlaneFeatures across `pulumi stack rename`, under the real Pulumi engine.

The component runs as an inline program through the pulumi CLI built in .tools/bin: its
KubeadmConfig against the harness's kube-apiserver (kube-system/kubeadm-config, the gate check
on /metrics), its remote commands through the command provider stand-in (tools/plugins) over a
real sshd on 127.0.0.1 with the pinned host key, onto a `FakeHost` (tests/fake_kubeadm_host.py:
kubeadm, systemctl and curl are recording stand-ins; sshd hands the session the host's paths).
One host is both the control-plane host and the kubelet host. The stack is renamed with the
CLI's `pulumi stack rename` between two `up`s: what it keeps on the ConfigMap and on the host
stays the stack's, a gate dropped after the rename leaves the kubelet and the record, a flipped
gate is not refused as another stack's, and destroy leaves the host and the ConfigMap as they
were.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pulumi
import pytest
import yaml
from kubernetes import client
from pulumi import automation as auto

from components import ControlPlaneFeatures, ControlPlaneFeaturesArgs, RemoteHost, SshAccess
from components.cluster_access import ClusterAccess
from components.control_plane_features.provider import ANNOTATION_PREFIX, LABEL_PREFIX
from tests.fake_kubeadm_host import FakeHost, kubelet_config
from tests.integration.conftest import SSHD, Sshd, require_tools
from tests.integration.test_kubeadm_config_live import CLUSTER_CONFIGURATION
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.pulumi_engine import PULUMI_ENGINE_TOOLS, inline_stack, use_cluster

PROJECT = "gpu-cluster-rename"
PLUGIN = "ExtendedResourceToleration"
FLIPPED = "CPUManagerPolicyBetaOptions"
"""A beta gate of the harness's API server: on before the rename, off after."""
DROPPED = "TopologyManagerPolicyAlphaOptions"
"""An alpha gate of the harness's API server: on before the rename, not wanted after."""


def _serve_host(sshd: Sshd, host: FakeHost) -> None:
    """Restart `sshd` so every session gets the host's paths (and its stand-ins on PATH)."""
    sshd.stop()
    config = sshd.root / "sshd_config"
    # One SetEnv line: sshd takes the first line of a keyword.
    settings = " ".join(f"{k}={v}" for k, v in host.env().items())
    config.write_text(f"{config.read_text()}SetEnv {settings}\n")
    sshd.log = (sshd.root / "sshd.log").open("a")
    sshd.process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)], stdout=sshd.log, stderr=sshd.log
    )
    sshd._wait()


class Rename:
    """The cluster, the host, and one stack whose wanted gates each `up` reads."""

    def __init__(self, cp: LocalControlPlane, sshd: Sshd, host: FakeHost, state: Path) -> None:
        self.cp = cp
        self.host = host
        self.core = client.CoreV1Api(cp.api_client())
        self.gates: dict[str, bool] = {}
        self.stack = inline_stack(PROJECT, "cpf-before", self._program(sshd), state)
        use_cluster(self.stack, cp.kubeconfig_yaml())

    def _program(self, sshd: Sshd) -> auto.PulumiFn:
        def program() -> None:
            this = RemoteHost(name="cp-1", address="127.0.0.1", host_key=sshd.public_host_key())
            ControlPlaneFeatures(
                "cpf",
                ControlPlaneFeaturesArgs(
                    access=ClusterAccess(provider=cast(Any, None)),  # no Kubernetes object
                    ssh=SshAccess(
                        user="root",
                        port=sshd.port,
                        private_key=pulumi.Output.secret(sshd.client_key.read_text()),
                    ),
                    control_plane_hosts=[this],
                    kubelet_hosts=[this],
                    admission_plugins=[PLUGIN],
                    feature_gates=dict(self.gates),
                    state_dir=str(self.host.state),
                    ready_timeout_seconds=30,
                ),
            )

        return program

    def up(self, gates: dict[str, bool]) -> auto.UpResult:
        self.gates = gates
        return self.stack.up()

    def configmap(self) -> Any:
        return self.core.read_namespaced_config_map("kubeadm-config", "kube-system")

    def document(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.configmap().data["ClusterConfiguration"]))

    def stack_annotations(self) -> dict[str, str]:
        """The records and labels of the stacks on the ConfigMap."""
        annotations = self.configmap().metadata.annotations or {}
        prefixes = (f"{ANNOTATION_PREFIX}/", f"{LABEL_PREFIX}/")
        return {k: v for k, v in annotations.items() if k.startswith(prefixes)}

    def feature_gates(self, component: str) -> str:
        extra = self.document()[component].get("extraArgs") or []
        return next((e["value"] for e in extra if e["name"] == "feature-gates"), "")

    def host_directories(self) -> list[str]:
        return sorted(p.name for p in self.host.state.iterdir()) if self.host.state.exists() else []


@pytest.fixture
def rename(tmp_path: Path, sshd: Sshd) -> Iterator[Rename]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    _serve_host(sshd, host)
    with LocalControlPlane() as cp:
        cp_client = cp.api_client()
        client.CoreV1Api(cp_client).create_namespaced_config_map(
            "kube-system",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="kubeadm-config"),
                data={"ClusterConfiguration": CLUSTER_CONFIGURATION},
            ),
        )
        scenario = Rename(cp, sshd, host, tmp_path / "state")
        try:
            yield scenario
        finally:
            scenario.stack.destroy()
            cp_client.close()


def test_control_plane_rename_engine_the_renamed_stack_keeps_and_cleans_what_it_added(
    rename: Rename,
) -> None:
    rename.up({FLIPPED: True, DROPPED: True})
    (stack_dir,) = rename.host_directories()
    assert rename.host.kubelet_settings()["featureGates"] == {FLIPPED: True, DROPPED: True}
    labels = {k: v for k, v in rename.stack_annotations().items() if k.startswith(LABEL_PREFIX)}
    assert list(labels.values()) == [f"organization/{PROJECT}/cpf-before"]

    rename.stack.rename("cpf-after")

    # A gate dropped after the rename: off on the kubelet, out of the ConfigMap and the record.
    rename.up({FLIPPED: True})
    assert rename.host_directories() == [stack_dir]  # nothing left under another key
    assert rename.host.kubelet_settings()["featureGates"] == {FLIPPED: True}
    for component in ("apiServer", "controllerManager", "scheduler"):
        assert rename.feature_gates(component) == f"{FLIPPED}=true", component
    annotations = rename.stack_annotations()
    assert len(annotations) == 2  # one record, one label
    assert DROPPED not in "".join(annotations.values())
    assert f"organization/{PROJECT}/cpf-after" in annotations.values()

    # A flipped gate: the stack under its new name is not another stack.
    rename.up({FLIPPED: False})
    assert rename.host_directories() == [stack_dir]
    assert rename.host.kubelet_settings()["featureGates"] == {FLIPPED: False}
    assert rename.feature_gates("scheduler") == f"{FLIPPED}=false"
    assert rename.up({FLIPPED: False}).summary.resource_changes == {"same": 7}

    rename.stack.destroy()
    assert rename.document() == yaml.safe_load(CLUSTER_CONFIGURATION)
    assert rename.stack_annotations() == {}
    assert rename.host_directories() == []
    assert rename.host.kubelet_config.read_text() == kubelet_config()
