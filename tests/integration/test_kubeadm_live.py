"""The built kubeadm (v1.37.2) with the stack's ClusterConfiguration, and the API server it renders.

1. KubeadmConfig edits kube-system/kubeadm-config on the harness API server; kubeadm renders the
   kube-apiserver manifest from that ClusterConfiguration (`init phase control-plane` with
   KUBEADM_INIT_DRYRUN_DIR, its output-directory mode); kube-apiserver started with exactly the
   rendered `--enable-admission-plugins` and `--feature-gates` adds the ExtendedResourceToleration
   toleration to a pod requesting `example.com/dongle`. After destroy the rendering has only
   the original plugins, and that API server adds no toleration. Only those two flags: the
   others point at kubeadm's certificates and etcd, which the harness supplies its own way.
2. The host commands (components/control_plane_features/hostscripts/kubeadm.sh) with the real kubeadm, which reads
   the cluster (the harness, with the objects kubeadm looks up for a control-plane node) and a
   host root in a temporary directory (`--rootfs`, which needs root); `FakeKubelet` keeps the
   mirror pods a kubelet would. The check runs on kubeadm's own
   `upgrade node phase control-plane --dry-run` output: kubeadm's manifests pass, a hand edit
   is refused by name. The control-plane command then runs kubeadm's upgrade phase for real:
   it writes the manifest with the stack's plugin, backs up the one it replaced, waits for the
   new static pod, and leaves the unchanged components alone. When the new pod never comes
   (the stand-in kubelet stopped; kubeadm's wait shortened to 20 s by an UpgradeConfiguration),
   kubeadm puts the old manifest back and the command fails saying so. The kubelet command's
   patch goes through kubeadm's `upgrade node phase kubelet-config --patches` into the
   kubelet's config file, and its removal takes the gates out again. kubeadm's own dry run of
   that phase is what the kubelet command compares with: a setting of the kubelet's config it
   would drop is refused by name, the same setting in the node's instance-config.yaml is kept,
   another stack's patch goes in too, and a run after a rollback applies the gates.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from components.control_plane_features.provider import KubeadmConfigProvider
from tests.control_plane_features.test_component import STACK_ID, registered_commands
from tests.fake_kubeadm_host import COMPONENTS, FakeHost
from tests.fake_node_api import stack_config_request
from tests.integration.conftest import built_tool
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
  external:
    endpoints:
    - https://10.0.0.5:2379
    caFile: /etc/kubernetes/pki/etcd/ca.crt
    certFile: /etc/kubernetes/pki/apiserver-etcd-client.crt
    keyFile: /etc/kubernetes/pki/apiserver-etcd-client.key
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

    kubeadm-config and kubelet-config ConfigMaps and the Node (kubeadm falls back to the host
    name without /etc/kubernetes/kubelet.conf). Its mirror pods come from `FakeKubelet`.
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


DEV_PLUGIN_ONLY = {
    "stack": "dev",
    "admission_plugins": ["ExtendedResourceToleration"],
    "feature_gates": {},
    "gates": {},
    "notes": {},
}
"""The dev stack's ConfigMap edit: the admission plugin, no gates."""


def _configured(control_plane: LocalControlPlane) -> KubeadmConfigProvider:
    """The provider configured with the stack's credentials, as the engine configures it."""
    provider = KubeadmConfigProvider()
    provider.configure(stack_config_request(control_plane.kubeconfig_yaml()))
    return provider


def test_kubeadm_live_renders_the_stacks_change_and_the_api_server_admits_with_it(
    kubeadm: Path,
    kubeadm_cluster: str,
    control_plane: LocalControlPlane,
    api_client: Any,
    control_plane_factory: Callable[..., LocalControlPlane],
    tmp_path: Path,
) -> None:
    provider = _configured(control_plane)
    gates = {"CPUManagerPolicyBetaOptions": True}
    props = {
        "stack": "live",
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": gates,
        "gates": gates,
        "notes": {},
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


class FakeKubelet:
    """Mirror pods for the static pods in a host root, as the kubelet would keep them.

    kubeadm reads the node's API endpoint from the kube-apiserver mirror pod and, after writing
    a manifest, waits for that component's mirror pod to come back with a new
    `kubernetes.io/config.hash` and to be running. A thread does that here whenever a manifest
    changes (the kubelet would also restart the container, which is not needed for this).
    """

    def __init__(self, core: client.CoreV1Api, node: str, manifests: Path) -> None:
        self.core, self.node, self.manifests = core, node, manifests
        self.seen = {c: self._hash(c) for c in COMPONENTS}
        for component, digest in self.seen.items():
            self._mirror(component, digest, replace=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _hash(self, component: str) -> str:
        data = (self.manifests / f"{component}.yaml").read_bytes()
        return hashlib.sha256(data).hexdigest()[:16]

    def _mirror(self, component: str, digest: str, replace: bool) -> None:
        name = f"{component}-{self.node}"
        if replace:  # mirror annotations are immutable: the kubelet recreates the pod
            self.core.delete_namespaced_pod(name, "kube-system", grace_period_seconds=0)
        annotations = {"kubernetes.io/config.hash": digest, "kubernetes.io/config.mirror": digest}
        if component == "kube-apiserver":
            endpoint = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"
            annotations[endpoint] = f"{ADVERTISE}:6443"
        self.core.create_namespaced_pod(
            "kube-system",
            client.V1Pod(
                metadata=client.V1ObjectMeta(
                    name=name,
                    labels={"component": component, "tier": "control-plane"},
                    annotations=annotations,
                ),
                spec=client.V1PodSpec(
                    node_name=self.node,
                    automount_service_account_token=False,
                    containers=[client.V1Container(name=component, image="registry.invalid/x:1")],
                ),
            ),
        )
        running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self.core.patch_namespaced_pod_status(name, "kube-system", {"status": running})

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for component, before in self.seen.items():
                try:
                    now = self._hash(component)
                except FileNotFoundError:  # between kubeadm's move and write
                    continue
                if now != before:
                    self.seen[component] = now
                    self._mirror(component, now, replace=True)

    def stop(self) -> None:
        """Stop recreating mirror pods, as a kubelet that cannot start the new pod."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for component in COMPONENTS:
            self.core.delete_namespaced_pod(
                f"{component}-{self.node}", "kube-system", grace_period_seconds=0
            )


class KubeadmHost:
    """A host root for `kubeadm --rootfs` (kubeadm's own manifests for the cluster's
    configuration, the etcd client files its upgrade loads) and a `kubeadm` on PATH for the
    host script that runs the real binary chrooted there."""

    def __init__(
        self, tmp_path: Path, kubeadm: Path, cp: LocalControlPlane, node: str, api_client: Any
    ) -> None:
        self.root = tmp_path / "rootfs"
        self.manifests = self.root / "etc" / "kubernetes" / "manifests"
        self.manifests.mkdir(parents=True)
        (self.root / "kubeconfig").write_text(cp.kubeconfig_yaml())
        pki = self.root / "etc" / "kubernetes" / "pki"
        (pki / "etcd").mkdir(parents=True)
        shutil.copy(cp.ca_path, pki / "etcd" / "ca.crt")
        shutil.copy(cp.admin_cert_path, pki / "apiserver-etcd-client.crt")
        shutil.copy(cp.admin_key_path, pki / "apiserver-etcd-client.key")
        rendered = _render(
            kubeadm, tmp_path, _cluster_configuration(api_client), node, rootfs=self.root
        )
        for component in COMPONENTS:
            shutil.copy(rendered / f"{component}.yaml", self.manifests / f"{component}.yaml")
        self.bin = tmp_path / "real-bin"
        self.bin.mkdir()
        wrapper = self.bin / "kubeadm"
        # kubeadm's wait for a new static pod, 5 minutes by default, shortened for the tests.
        (self.root / "upgrade.yaml").write_text(
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: UpgradeConfiguration\n"
            "timeouts:\n  upgradeManifests: 20s\n"
        )
        wrapper.write_text(
            f'#!/bin/sh\necho "kubeadm $*" >>"$CALLS"\n'
            f'exec {kubeadm} "$@" --config /upgrade.yaml --kubeconfig /kubeconfig '
            f"--rootfs {self.root}\n"
        )
        wrapper.chmod(0o755)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "MANIFESTS": str(self.manifests)}

    def backups(self) -> list[Path]:
        return sorted(
            (self.root / "etc" / "kubernetes" / "tmp").glob("kubeadm-backup-manifests-*/*")
        )


@pytest.fixture
def kubeadm_host(
    tmp_path: Path,
    kubeadm: Path,
    kubeadm_cluster: str,
    control_plane: LocalControlPlane,
    api_client: Any,
) -> Iterator[tuple[KubeadmHost, FakeKubelet]]:
    if os.geteuid() != 0:
        pytest.skip("kubeadm --rootfs chroots, which needs root")
    host = KubeadmHost(tmp_path, kubeadm, control_plane, kubeadm_cluster, api_client)
    with FakeKubelet(client.CoreV1Api(api_client), kubeadm_cluster, host.manifests) as kubelet:
        yield host, kubelet


def test_kubeadm_live_host_check_reads_kubeadms_own_dry_run(
    kubeadm_host: tuple[KubeadmHost, FakeKubelet], tmp_path: Path
) -> None:
    real, _ = kubeadm_host
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    check = registered_commands(host)["cpf-guard-cp-1"].inputs["create"]

    passed = host.run(check, real.env())
    assert passed.returncode == 0, passed.stderr
    assert "control-plane manifests match kubeadm's rendering" in passed.stderr

    scheduler = real.manifests / "kube-scheduler.yaml"
    scheduler.write_text(
        scheduler.read_text().replace(
            "    - --bind-address", "    - --profiling=false\n    - --bind-address"
        )
    )
    refused = host.run(check, real.env())
    assert refused.returncode == 1
    assert f"{scheduler}:\n    - --profiling=false" in refused.stderr


def test_kubeadm_live_host_regenerates_with_kubeadms_upgrade_phase(
    kubeadm_host: tuple[KubeadmHost, FakeKubelet],
    control_plane: LocalControlPlane,
    tmp_path: Path,
) -> None:
    real, kubelet = kubeadm_host
    apiserver = real.manifests / "kube-apiserver.yaml"
    before = apiserver.read_text()
    unchanged = {c: kubelet.seen[c] for c in COMPONENTS if c != "kube-apiserver"}
    _configured(control_plane).create(dict(DEV_PLUGIN_ONLY))
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    command = registered_commands(host, feature_gates={})["cpf-control-plane-cp-1"]

    result = host.run(command.inputs["create"], real.env())
    assert result.returncode == 0, result.stderr
    assert "- --enable-admission-plugins=NodeRestriction,ExtendedResourceToleration" in (
        apiserver.read_text()
    )
    # kubeadm backed up the manifest it replaced, and left the unchanged ones alone.
    (backup,) = real.backups()
    assert backup.name == "kube-apiserver.yaml"
    assert backup.read_text() == before
    assert {c: kubelet.seen[c] for c in unchanged} == unchanged


def test_kubeadm_live_host_failure_is_rolled_back_by_kubeadm_and_stops_the_command(
    kubeadm_host: tuple[KubeadmHost, FakeKubelet],
    control_plane: LocalControlPlane,
    tmp_path: Path,
) -> None:
    real, kubelet = kubeadm_host
    kubelet.stop()  # the new kube-apiserver never comes up
    apiserver = real.manifests / "kube-apiserver.yaml"
    before = apiserver.read_text()
    _configured(control_plane).create(dict(DEV_PLUGIN_ONLY))
    (tmp_path / "host").mkdir()
    host = FakeHost(tmp_path / "host")
    command = registered_commands(host, feature_gates={})["cpf-control-plane-cp-1"]

    result = host.run(command.inputs["create"], real.env())
    assert result.returncode == 1
    assert "kubeadm has tried to recover everything into the earlier state" in result.stderr
    assert (
        "kubeadm upgrade node phase control-plane failed (kubeadm rolled the manifests back)"
        in (result.stderr)
    )
    assert apiserver.read_text() == before
    assert not (host.state / STACK_ID).exists()  # nothing recorded for a failed run


class KubeletNode:
    """The kubelet side of a `KubeadmHost`: its config file in the host root, the stack's
    state directory at the same path outside and inside kubeadm's chroot, and the registered
    kubelet commands run with the real kubeadm (systemctl and curl stay stand-ins)."""

    def __init__(self, real: KubeadmHost, tmp_path: Path) -> None:
        self.config = real.root / "var" / "lib" / "kubelet" / "config.yaml"
        self.config.parent.mkdir(parents=True)
        self.config.write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        )
        self.instance_config = self.config.parent / "instance-config.yaml"
        (tmp_path / "host").mkdir()
        self.host = FakeHost(tmp_path / "host")
        self.inside = real.root / str(self.host.state).lstrip("/")
        self.inside.mkdir(parents=True)
        self.host.state.symlink_to(self.inside)
        self.commands = registered_commands(self.host)["cpf-kubelet-gpu-1"].inputs
        self.env = {
            "PATH": f"{real.bin}:{self.host.root / 'bin'}:/usr/bin:/bin",
            "KUBELET_CONFIG": str(self.config),
        }

    def run(self, which: str) -> subprocess.CompletedProcess[str]:
        return self.host.run(self.commands[which], self.env)

    def settings(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.config.read_text()))


@pytest.fixture
def kubelet_node(kubeadm_host: tuple[KubeadmHost, FakeKubelet], tmp_path: Path) -> KubeletNode:
    return KubeletNode(kubeadm_host[0], tmp_path)


def test_kubeadm_live_kubelet_patch_goes_through_kubeadms_kubelet_config_phase(
    kubelet_node: KubeletNode,
) -> None:
    node = kubelet_node
    applied = node.run("create")
    assert applied.returncode == 0, applied.stderr
    written = node.settings()
    assert written["featureGates"] == {"CPUManagerPolicyBetaOptions": True}
    assert written["staticPodPath"] == "/etc/kubernetes/manifests"  # from the kubelet-config CM
    assert "systemctl restart kubelet" in node.host.calls.read_text()

    again = node.run("update")
    assert again.returncode == 0, again.stderr
    assert "kubelet already runs with this configuration" in again.stderr
    assert node.host.calls.read_text().count("systemctl restart kubelet") == 1

    removed = node.run("delete")
    assert removed.returncode == 0, removed.stderr
    assert "featureGates" not in node.settings()
    assert not (node.inside / "dev").exists()


def test_kubeadm_live_kubelet_refuses_a_node_setting_kubeadm_would_drop(
    kubelet_node: KubeletNode,
) -> None:
    node = kubelet_node
    node.config.write_text(node.config.read_text() + "cpuManagerPolicy: static\nmaxPods: 250\n")
    before = node.config.read_text()
    refused = node.run("create")
    assert refused.returncode == 1
    assert "refusing: kubeadm would drop these settings of" in refused.stderr
    assert "  cpuManagerPolicy: static (kubeadm would write nothing)" in refused.stderr
    assert "  maxPods: 250 (kubeadm would write nothing)" in refused.stderr
    assert node.config.read_text() == before
    assert "systemctl" not in node.host.calls.read_text()


def test_kubeadm_live_kubelet_keeps_node_settings_of_the_instance_config(
    kubelet_node: KubeletNode,
) -> None:
    # Where the refusal sends a node's own settings: kubeadm applies that file last itself.
    node = kubelet_node
    node.config.write_text(node.config.read_text() + "cpuManagerPolicy: static\nmaxPods: 250\n")
    node.instance_config.write_text(
        'containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock"\n'
        "cpuManagerPolicy: static\nmaxPods: 250\n"
    )
    applied = node.run("create")
    assert applied.returncode == 0, applied.stderr
    written = node.settings()
    assert (written["cpuManagerPolicy"], written["maxPods"]) == ("static", 250)
    assert written["featureGates"] == {"CPUManagerPolicyBetaOptions": True}


def test_kubeadm_live_kubelet_keeps_another_stacks_gates(kubelet_node: KubeletNode) -> None:
    node = kubelet_node
    other = {"KubeletPodResourcesDynamicResources": True}
    node.host.add_kubelet_patch("prod", other)
    applied = node.run("create")
    assert applied.returncode == 0, applied.stderr
    assert node.settings()["featureGates"] == {**other, "CPUManagerPolicyBetaOptions": True}

    removed = node.run("delete")
    assert removed.returncode == 0, removed.stderr
    assert node.settings()["featureGates"] == other


def test_kubeadm_live_kubelet_rerun_after_a_rollback_sets_the_gates(
    kubelet_node: KubeletNode,
) -> None:
    node = kubelet_node
    before = node.config.read_text()
    node.host.health.write_text("not ok")
    failed = node.run("create")
    assert failed.returncode == 1
    assert "kubelet not healthy within 2s" in failed.stderr
    assert node.config.read_text() == before

    node.host.health.write_text("ok")
    again = node.run("create")
    assert again.returncode == 0, again.stderr
    assert node.settings()["featureGates"] == {"CPUManagerPolicyBetaOptions": True}
