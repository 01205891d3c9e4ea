"""The built kubeadm (v1.37.2) with the stack's ClusterConfiguration, and the API server it renders.

1. KubeadmConfig edits kube-system/kubeadm-config on the harness API server; kubeadm renders the
   kube-apiserver manifest from that ClusterConfiguration (`init phase control-plane` with
   KUBEADM_INIT_DRYRUN_DIR, its output-directory mode); kube-apiserver started with exactly the
   rendered `--enable-admission-plugins` and `--feature-gates` adds the ExtendedResourceToleration
   toleration to a pod requesting `example.com/dongle`. After destroy the rendering has only
   the original plugins, and that API server adds no toleration. Only those two flags: the
   others point at kubeadm's certificates and etcd, which the harness supplies its own way.
2. The host check (components/hostscripts/kubeadm.sh) runs on the real
   `kubeadm upgrade node phase control-plane --dry-run` output: kubeadm reads the cluster (the
   harness, with the objects kubeadm looks up for a control-plane node) and a host root in a
   temporary directory (`--rootfs`, which needs root). Manifests kubeadm rendered pass; a hand
   edit is refused by name.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from components.providers.kubeadm_config import KubeadmConfigProvider
from tests.fake_kubeadm_host import COMPONENTS, FakeHost
from tests.integration.conftest import built_tool
from tests.test_control_plane_features import registered_commands
from tools.harness import LocalControlPlane

RESOURCE = "example.com/dongle"
ADVERTISE = "10.0.0.11"
CLUSTER_CONFIGURATION = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
clusterName: kubernetes
controlPlaneEndpoint: 10.0.0.11:6443
certificatesDir: /etc/kubernetes/pki
imageRepository: registry.k8s.io
apiServer:
  extraArgs:
  - name: enable-admission-plugins
    value: NodeRestriction
controllerManager: {}
scheduler: {}
etcd:
  local:
    dataDir: /var/lib/etcd
networking:
  dnsDomain: cluster.local
  serviceSubnet: 10.96.0.0/12
"""


def _init_configuration(node: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "InitConfiguration",
            "localAPIEndpoint": {"advertiseAddress": ADVERTISE, "bindPort": 6443},
            "nodeRegistration": {"name": node},
        }
    )


@pytest.fixture
def kubeadm() -> Path:
    return built_tool("kubeadm")


@pytest.fixture
def kubeadm_cluster(control_plane: LocalControlPlane, api_client: Any) -> Iterator[str]:
    """What kubeadm reads for a control-plane node named after this host; yields the node name.

    kubeadm-config and kubelet-config ConfigMaps, the Node (kubeadm falls back to the host
    name without /etc/kubernetes/kubelet.conf) and its kube-apiserver mirror pod, whose
    annotation gives kubeadm the node's API endpoint.
    """
    core = client.CoreV1Api(api_client)
    node = socket.gethostname().lower()
    objects: list[Callable[[], Any]] = []
    core.create_namespaced_config_map(
        "kube-system",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="kubeadm-config"),
            data={"ClusterConfiguration": CLUSTER_CONFIGURATION},
        ),
    )
    objects.append(lambda: core.delete_namespaced_config_map("kubeadm-config", "kube-system"))
    core.create_namespaced_config_map(
        "kube-system",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="kubelet-config"),
            data={
                "kubelet": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            },
        ),
    )
    objects.append(lambda: core.delete_namespaced_config_map("kubelet-config", "kube-system"))
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    objects.append(lambda: core.delete_node(node))
    try:
        core.create_namespaced_service_account(
            "kube-system", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    pod = f"kube-apiserver-{node}"
    core.create_namespaced_pod(
        "kube-system",
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=pod,
                labels={"component": "kube-apiserver", "tier": "control-plane"},
                annotations={
                    "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": (
                        f"{ADVERTISE}:6443"
                    )
                },
            ),
            spec=client.V1PodSpec(
                node_name=node,
                automount_service_account_token=False,
                containers=[
                    client.V1Container(
                        name="kube-apiserver", image="registry.k8s.io/kube-apiserver:v1.37.2"
                    )
                ],
            ),
        ),
    )
    objects.append(lambda: core.delete_namespaced_pod(pod, "kube-system", grace_period_seconds=0))
    try:
        yield node
    finally:
        for delete in reversed(objects):
            delete()


def _cluster_configuration(api_client: Any) -> str:
    cm = client.CoreV1Api(api_client).read_namespaced_config_map("kubeadm-config", "kube-system")
    assert cm.data is not None
    return str(cm.data["ClusterConfiguration"])


def _render(
    kubeadm: Path, tmp_path: Path, cluster_configuration: str, node: str, rootfs: Path | None = None
) -> Path:
    """kubeadm's control-plane manifests for `cluster_configuration`, in a new directory.

    With `rootfs`, kubeadm runs chrooted there, as it does for the host check: which host
    directories get a volume depends on what exists on the host.
    """
    name = f"render-{uuid.uuid4().hex[:6]}"
    out = (rootfs or tmp_path) / name
    out.mkdir()
    (out / "kubeadm.yaml").write_text(_init_configuration(node) + "---\n" + cluster_configuration)
    inside = Path("/", name) if rootfs else out
    argv = [str(kubeadm), "init", "phase", "control-plane", "all", "--dry-run"]
    argv += ["--config", str(inside / "kubeadm.yaml")]
    argv += ["--rootfs", str(rootfs)] if rootfs else []
    subprocess.run(
        argv,
        check=True,
        capture_output=True,
        env={**os.environ, "KUBEADM_INIT_DRYRUN_DIR": str(inside)},
        timeout=120,
    )
    return out


def _flags(manifest: Path) -> list[str]:
    pod = yaml.safe_load(manifest.read_text())
    (container,) = pod["spec"]["containers"]
    wanted = ("--enable-admission-plugins", "--feature-gates")
    return [arg for arg in container["command"] if arg.split("=", 1)[0] in wanted]


def _pod_tolerations(cp: LocalControlPlane) -> list[tuple[str, str, str]]:
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
        created = client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    finally:
        api.close()
    tolerations = (created.spec.tolerations if created.spec else None) or []
    return [(str(t.key), str(t.operator), str(t.effect)) for t in tolerations if t.key == RESOURCE]


def test_kubeadm_live_renders_the_stacks_change_and_the_api_server_admits_with_it(
    kubeadm: Path,
    kubeadm_cluster: str,
    control_plane: LocalControlPlane,
    api_client: Any,
    control_plane_factory: Callable[..., LocalControlPlane],
    tmp_path: Path,
) -> None:
    provider = KubeadmConfigProvider()
    gates = {"CPUManagerPolicyBetaOptions": True}
    props = {
        "stack": "live",
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": gates,
        "gates": gates,
        "notes": {},
        "kubeconfig": control_plane.kubeconfig_yaml(),
        "context": "",
    }
    outs = provider.create(props).outs
    assert outs is not None
    rendered = _render(kubeadm, tmp_path, _cluster_configuration(api_client), kubeadm_cluster)
    flags = _flags(rendered / "kube-apiserver.yaml")
    assert flags == [
        "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",
        "--feature-gates=CPUManagerPolicyBetaOptions=true",
    ]
    for component in ("kube-controller-manager", "kube-scheduler"):
        assert "--feature-gates=CPUManagerPolicyBetaOptions=true" in (
            (rendered / f"{component}.yaml").read_text()
        )
    cp = control_plane_factory(flags)
    assert _pod_tolerations(cp) == [(RESOURCE, "Exists", "NoSchedule")]
    metrics = cp.get("/metrics")
    assert (
        'kubernetes_feature_enabled{name="CPUManagerPolicyBetaOptions",stage="BETA"} 1' in metrics
    )

    provider.delete("id", outs)
    original = _render(kubeadm, tmp_path, _cluster_configuration(api_client), kubeadm_cluster)
    flags = _flags(original / "kube-apiserver.yaml")
    assert flags == ["--enable-admission-plugins=NodeRestriction"]
    assert _pod_tolerations(control_plane_factory(flags)) == []


def _rootfs_kubeadm(tmp_path: Path, kubeadm: Path, kubeconfig: str) -> tuple[Path, Path]:
    """A host root for `kubeadm --rootfs` and a `kubeadm` on PATH that uses it."""
    root = tmp_path / "rootfs"
    (root / "etc" / "kubernetes" / "manifests").mkdir(parents=True)
    (root / "kubeconfig").write_text(kubeconfig)
    bin_dir = tmp_path / "real-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kubeadm"
    wrapper.write_text(
        f'#!/bin/sh\necho "kubeadm $*" >>"$CALLS"\n'
        f'exec {kubeadm} "$@" --kubeconfig /kubeconfig --rootfs {root}\n'
    )
    wrapper.chmod(0o755)
    return root, bin_dir


def test_kubeadm_live_host_check_reads_kubeadms_own_dry_run(
    kubeadm: Path,
    kubeadm_cluster: str,
    control_plane: LocalControlPlane,
    api_client: Any,
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("kubeadm --rootfs chroots, which needs root")
    root, bin_dir = _rootfs_kubeadm(tmp_path, kubeadm, control_plane.kubeconfig_yaml())
    manifests = root / "etc" / "kubernetes" / "manifests"
    rendered = _render(
        kubeadm, tmp_path, _cluster_configuration(api_client), kubeadm_cluster, rootfs=root
    )
    for component in COMPONENTS:
        (manifests / f"{component}.yaml").write_text((rendered / f"{component}.yaml").read_text())
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    check = registered_commands(host)["cpf-guard-cp-1"].inputs["create"]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MANIFESTS": str(manifests)}

    passed = host.run(check, env)
    assert passed.returncode == 0, passed.stderr
    assert "control-plane manifests match kubeadm's rendering" in passed.stderr

    scheduler = manifests / "kube-scheduler.yaml"
    scheduler.write_text(
        scheduler.read_text().replace(
            "    - --bind-address", "    - --profiling=false\n    - --bind-address"
        )
    )
    refused = host.run(check, env)
    assert refused.returncode == 1
    assert f"{scheduler}:\n    - --profiling=false" in refused.stderr
