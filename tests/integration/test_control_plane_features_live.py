"""The flags the host editor writes are the flags a real kube-apiserver honours.

The editor runs for real on a temporary copy of kubeadm's v1.34 kube-apiserver manifest; the
`--enable-admission-plugins` and `--feature-gates` items are read back from the edited manifest
and the harness's kube-apiserver (v1.34.4) is started with exactly those two flags. Only those
two: the manifest's other flags point at kubeadm's certificates and etcd, which do not exist
here, and the harness supplies its own. A pod requesting an extended resource must then get
the toleration that ExtendedResourceToleration adds (the behaviour seed 000 relies on); with the
flags of the unedited manifest it must not.

The SSH half (pulumi-command connecting to a host, the kubelet restarting the static pod)
cannot run here; tests/test_control_plane_features.py covers the commands and the host script.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from components.control_plane_features import SCRIPT
from components.hostscripts.kube_flags_edit import build_argv
from tools.harness import LocalControlPlane

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "kubeadm" / "v1.34" / "kube-apiserver.yaml"
)
FLAGS = ("--enable-admission-plugins", "--feature-gates")
RESOURCE = "example.com/dongle"


def _flags(manifest: Path) -> list[str]:
    """The admission-plugin and feature-gate items of the manifest's kube-apiserver command."""
    pod = yaml.safe_load(manifest.read_text())
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "kube-apiserver"]
    return [arg for arg in container["command"] if arg.split("=", 1)[0] in FLAGS]


def _edited_manifest(tmp_path: Path) -> Path:
    manifest = tmp_path / "manifests" / "kube-apiserver.yaml"
    manifest.parent.mkdir()
    manifest.write_bytes(FIXTURE.read_bytes())
    argv = build_argv(
        "apiserver-manifest",
        "apply",
        file=str(manifest),
        state=str(tmp_path / "state" / "kube-apiserver.json"),
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"HPAScaleToZero": True},
        kubernetes_version="v1.37.2",
        backup_dir=str(tmp_path / "backups"),
    )
    subprocess.run([sys.executable, str(SCRIPT), *argv], check=True, capture_output=True)
    return manifest


def _created_pod(cp: LocalControlPlane) -> Any:
    ns = f"dongle-{uuid.uuid4().hex[:8]}"
    cp.create_namespace(ns)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/pause:1",
                    resources=client.V1ResourceRequirements(limits={RESOURCE: "1"}),
                )
            ],
        ),
    )
    api = cp.api_client()
    try:
        return client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    finally:
        api.close()


def _resource_tolerations(pod: Any) -> list[tuple[str, str, str]]:
    return [(t.key, t.operator, t.effect) for t in pod.spec.tolerations or [] if t.key == RESOURCE]


def test_control_plane_features_live_edited_flags_add_the_toleration(
    tmp_path: Path, control_plane_factory: Callable[..., LocalControlPlane]
) -> None:
    flags = _flags(_edited_manifest(tmp_path))
    assert flags == [
        "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",
        "--feature-gates=HPAScaleToZero=true",
    ]
    cp = control_plane_factory(flags)
    assert _resource_tolerations(_created_pod(cp)) == [(RESOURCE, "Exists", "NoSchedule")]
    # The gate flag was accepted and is in effect, not just present on the command line.
    metrics = cp.get("/metrics")
    assert 'kubernetes_feature_enabled{name="HPAScaleToZero",stage="BETA"} 1' in metrics


def test_control_plane_features_live_original_flags_add_no_toleration(
    control_plane_factory: Callable[..., LocalControlPlane],
) -> None:
    flags = _flags(FIXTURE)
    assert flags == ["--enable-admission-plugins=NodeRestriction"]
    cp = control_plane_factory(flags)
    assert _resource_tolerations(_created_pod(cp)) == []
