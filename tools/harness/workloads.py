"""A container runtime for the stack's own pods, where the image is a tool built here.

kwok reports every pod Running without running anything. For the pods whose behaviour the
scenarios depend on (the binpack kube-scheduler, the OPA gate), this runs the container's
command as a local process, the way a kubelet would start it:

- the pod's volumes are materialized in a directory of its own (ConfigMaps and Secrets as
  files, the projected service-account token from a TokenRequest bound to the pod, the
  cluster CA and namespace), and every argument under a mount path is pointed there;
- the process listens on the pod's own IP (kwok gives pods loopback addresses), so Services
  and webhooks reach it through the cluster's endpoints, as on a real cluster;
- in-cluster credentials become a kubeconfig holding that pod's token, so the process
  talks to the API server as the pod's ServiceAccount and the stack's RBAC is what is tested.

None of this is a product feature; it exists for tests/e2e and `make demo`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tools.harness.child_process import ManagedProcess
from tools.harness.cluster import LocalCluster
from tools.harness.tools import require_tool

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600


@dataclass
class PodFiles:
    """Where a pod's volumes were materialized, and its in-cluster kubeconfig."""

    root: Path
    mounts: dict[str, Path]
    """Container mount path -> local directory."""
    kubeconfig: Path | None

    def local(self, path: str) -> str:
        """`path` inside the container, as a local path (longest mount first)."""
        for mount in sorted(self.mounts, key=len, reverse=True):
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return str(self.mounts[mount]) + path[len(mount.rstrip("/")) :]
        return path

    def rewrite(self, arg: str) -> str:
        """An argument with any container path in it (`--flag=/path`, `/path`) made local."""
        flag, eq, value = arg.partition("=")
        if eq and value.startswith("/"):
            return f"{flag}={self.local(value)}"
        prefix, colon, path = arg.partition(":")
        if colon and path.startswith("/") and not arg.startswith("/"):  # opa's <path>:<file>
            return f"{prefix}:{self.local(path)}"
        return self.local(arg) if arg.startswith("/") else arg


# What the image runs as a local process: argv from the container, the pod's IP and files.
Adapter = Callable[[list[str], str, PodFiles], list[str]]


def _kube_scheduler(argv: list[str], pod_ip: str, files: PodFiles) -> list[str]:
    """kube-scheduler: its config's in-cluster connection becomes the pod's kubeconfig."""
    if files.kubeconfig is None:
        raise RuntimeError("kube-scheduler pod without a service-account token")
    result = []
    for arg in argv:
        if arg.startswith("--config="):
            source = Path(arg.partition("=")[2])
            config = yaml.safe_load(source.read_text())
            config.setdefault("clientConnection", {})["kubeconfig"] = str(files.kubeconfig)
            local = files.root / "kube-scheduler-config.yaml"
            local.write_text(yaml.safe_dump(config))
            arg = f"--config={local}"
        result.append(arg)
    return [
        *result,
        f"--bind-address={pod_ip}",
        f"--authentication-kubeconfig={files.kubeconfig}",
        f"--authorization-kubeconfig={files.kubeconfig}",
    ]


def _opa(argv: list[str], pod_ip: str, files: PodFiles) -> list[str]:
    """opa: listen on the pod's IP where the container listens on every address."""
    result = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        scheme, sep, address = value.rpartition("://")
        host, _, port = address.rpartition(":")
        if eq and flag in ("--addr", "--diagnostic-addr") and host in ("", "0.0.0.0"):
            arg = f"{flag}={scheme}{sep}{pod_ip}:{port}"
        result.append(arg)
    return result


# Image repository -> (built tool, adapter).
IMAGES: dict[str, tuple[str, Adapter]] = {
    "registry.k8s.io/kube-scheduler": ("kube-scheduler", _kube_scheduler),
    "openpolicyagent/opa": ("opa", _opa),
}
# An image built from scheduler/ is published under any registry (README): known by its name.
IMAGE_NAMES: dict[str, tuple[str, Adapter]] = {
    "gpu-binpack-scheduler": ("gpu-binpack-scheduler", _kube_scheduler),
}


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def known_image(image: str) -> tuple[str, Adapter] | None:
    """The built tool (and its adapter) that stands in for `image`, if any."""
    repository = _repository(image)
    return IMAGES.get(repository) or IMAGE_NAMES.get(repository.rpartition("/")[2])


@dataclass
class PodProcess:
    namespace: str
    name: str
    uid: str
    container: str
    ip: str
    process: ManagedProcess


class PodRuntime:
    """Runs the known containers of Running pods as local processes; stops them when gone."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.processes: dict[str, PodProcess] = {}
        """Pod uid -> its process."""

    # ------------------------------------------------------------------ sync
    def sync(self, namespaces: Sequence[str] | None = None) -> list[PodProcess]:
        """Start a process for every Running pod with a known image (again where it died);
        stop those of gone pods.

        Returns the processes started by this call.
        """
        api = self.cluster.api_client()
        core: Any = client.CoreV1Api(api)
        pods: list[Any] = core.list_pod_for_all_namespaces().items
        live = {pod.metadata.uid for pod in pods if pod.metadata.deletion_timestamp is None}
        for uid in [uid for uid in self.processes if uid not in live]:
            self.processes.pop(uid).process.stop()
        # A container that died is started again, as a kubelet restarts it (restartPolicy
        # Always), by the loop below.
        for uid in [uid for uid, p in self.processes.items() if not p.process.running()]:
            self.processes.pop(uid)
        started = []
        for pod in pods:
            if namespaces is not None and pod.metadata.namespace not in namespaces:
                continue
            if pod.metadata.uid in self.processes or pod.status.phase != "Running":
                continue
            if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip:
                continue
            for container in pod.spec.containers:
                known = known_image(container.image)
                if known is not None:
                    started.append(self._start(core, pod, container, *known))
                    break
        return started

    def stop(self) -> None:
        for entry in self.processes.values():
            entry.process.stop()
        self.processes.clear()

    def of(self, namespace: str, prefix: str = "") -> list[PodProcess]:
        return [
            p
            for p in self.processes.values()
            if p.namespace == namespace and p.name.startswith(prefix)
        ]

    # ----------------------------------------------------------------- start
    def _start(
        self, core: Any, pod: Any, container: Any, tool: str, adapter: Adapter
    ) -> PodProcess:
        meta = pod.metadata
        files = self._materialize(core, pod, container)
        # `command` replaces the image's entrypoint (the tool itself); `args` follow it.
        arguments = [*(container.command or [tool])[1:], *(container.args or [])]
        argv = [str(require_tool(tool)), *(files.rewrite(arg) for arg in arguments)]
        argv = adapter(argv, pod.status.pod_ip, files)
        process = ManagedProcess(f"{meta.namespace}-{meta.name}", argv, files.root / "log")
        process.start()
        entry = PodProcess(
            meta.namespace, meta.name, meta.uid, container.name, pod.status.pod_ip, process
        )
        self.processes[meta.uid] = entry
        return entry

    def _materialize(self, core: Any, pod: Any, container: Any) -> PodFiles:
        meta = pod.metadata
        root = self.workdir / f"{meta.namespace}-{meta.name}"
        root.mkdir(parents=True, exist_ok=True)
        volumes = {volume.name: volume for volume in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        kubeconfig = None
        for mount in container.volume_mounts or []:
            volume = volumes[mount.name]
            target = root / "volumes" / mount.name
            target.mkdir(parents=True, exist_ok=True)
            files = self._volume_files(core, pod, volume)
            for key, data in files.items():
                (target / key).write_bytes(data)
            if "token" in files and mount.mount_path == SERVICE_ACCOUNT_DIR:
                kubeconfig = self._kubeconfig(root, files)
            mounts[mount.mount_path] = target
        return PodFiles(root, mounts, kubeconfig)

    def _volume_files(self, core: Any, pod: Any, volume: Any) -> dict[str, bytes]:
        ns = pod.metadata.namespace
        if volume.config_map is not None:
            data = core.read_namespaced_config_map(volume.config_map.name, ns).data or {}
            return _items({k: v.encode() for k, v in data.items()}, volume.config_map.items)
        if volume.secret is not None:
            data = core.read_namespaced_secret(volume.secret.secret_name, ns).data or {}
            decoded = {k: base64.b64decode(v) for k, v in data.items()}
            return _items(decoded, volume.secret.items)
        if volume.projected is not None:
            files: dict[str, bytes] = {}
            for source in volume.projected.sources or []:
                if source.service_account_token is not None:
                    files[source.service_account_token.path] = self._token(core, pod).encode()
                elif source.config_map is not None:
                    data = core.read_namespaced_config_map(source.config_map.name, ns).data or {}
                    raw = {k: v.encode() for k, v in data.items()}
                    files.update(_items(raw, source.config_map.items))
                elif source.downward_api is not None:
                    for item in source.downward_api.items or []:
                        if item.field_ref and item.field_ref.field_path == "metadata.namespace":
                            files[item.path] = ns.encode()
            return files
        return {}  # emptyDir and the like: an empty directory

    def _token(self, core: Any, pod: Any) -> str:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=TOKEN_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        response = core.create_namespaced_service_account_token(
            pod.spec.service_account_name or "default", pod.metadata.namespace, request
        )
        return str(response.status.token)

    def _kubeconfig(self, root: Path, files: Mapping[str, bytes]) -> Path:
        """What client-go's in-cluster config builds from the mounted token."""
        path = root / "in-cluster.kubeconfig"
        path.write_text(
            self.cluster.control_plane.kubeconfig_yaml(user={"token": files["token"].decode()})
        )
        path.chmod(0o600)
        return path


def _items(data: Mapping[str, bytes], items: Sequence[Any] | None) -> dict[str, bytes]:
    if not items:
        return dict(data)
    return {item.path: data[item.key] for item in items if item.key in data}
