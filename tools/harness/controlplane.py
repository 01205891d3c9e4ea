"""Run a throw-away etcd + kube-apiserver (+ kube-scheduler) on 127.0.0.1.

:class:`LocalControlPlane` only ties the parts together, in order: the tools
(:mod:`.tools`, version-checked), the certificates (:mod:`.certs`), :mod:`.etcd`,
the kubeconfig (:mod:`.kubeconfig`), :mod:`.apiserver`, and on demand :mod:`.scheduler`. A
partial start is rolled back: whatever started is stopped and the work dir removed, and the error
names the process that failed with the tail of every log.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import kubeconfig
from .apiserver import KUBERNETES_SERVICE_IP, APIServer
from .certs import ControlPlanePki
from .child_process import (
    ControlPlaneError,
    Lifecycle,
    ManagedProcess,
    no_proxy_opener,
)
from .etcd import Etcd
from .scheduler import SchedulerHandle, start_scheduler
from .tools import require_tool

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


WORKDIR_PREFIX = "gpu-cluster-cp-"
OWNER_FILE = "owner.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_workdirs(base_dir: str | Path | None) -> None:
    """Remove temp dirs left by control planes whose Python process was killed.

    Their processes are already gone (PR_SET_PDEATHSIG), only files remain.
    """
    parent = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
    for workdir in parent.glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not _pid_alive(owner):
            shutil.rmtree(workdir, ignore_errors=True)


class LocalControlPlane(Lifecycle):
    """etcd + kube-apiserver on 127.0.0.1 with fresh certificates, in a temp dir.

    Use as a context manager (or call :meth:`start` / :meth:`stop`)::

        with LocalControlPlane(["--feature-gates=Foo=true"]) as cp:
            print(cp.kubeconfig_path)

    ``extra_apiserver_flags`` are appended to the kube-apiserver command line;
    a default flag with the same name (e.g. ``--authorization-mode``) is dropped
    so that the extra flag replaces it rather than being merged with it.
    """

    def __init__(
        self,
        extra_apiserver_flags: Sequence[str] = (),
        *,
        startup_timeout: float = 90.0,
        extra_etcd_flags: Sequence[str] = (),
        base_dir: str | Path | None = None,
    ) -> None:
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.extra_etcd_flags = list(extra_etcd_flags)
        self.startup_timeout = startup_timeout
        self._base_dir = base_dir
        self._workdir: Path | None = None
        self._etcd: Etcd | None = None
        self._apiserver: APIServer | None = None
        self._schedulers: list[SchedulerHandle] = []
        self._started = False
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ paths
    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("control plane not started")
        return self._workdir

    @property
    def pki(self) -> ControlPlanePki:
        return ControlPlanePki(self.workdir / "pki")

    @property
    def pki_dir(self) -> Path:
        return self.pki.dir

    @property
    def ca_path(self) -> Path:
        return self.pki.ca

    @property
    def admin_cert_path(self) -> Path:
        return self.pki.admin_cert

    @property
    def admin_key_path(self) -> Path:
        return self.pki.admin_key

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def secure_port(self) -> int:
        return self._apiserver.secure_port if self._apiserver is not None else 0

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:40123``."""
        return f"https://127.0.0.1:{self.secure_port}"

    @property
    def etcd_client_port(self) -> int:
        return self._etcd.client_port if self._etcd is not None else 0

    @property
    def etcd_peer_port(self) -> int:
        return self._etcd.peer_port if self._etcd is not None else 0

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def etcd_log_path(self) -> Path:
        return self.workdir / "etcd.log"

    @property
    def apiserver_log_path(self) -> Path:
        return self.workdir / "kube-apiserver.log"

    @property
    def etcd_process(self) -> ManagedProcess | None:
        return self._etcd.process if self._etcd is not None else None

    @property
    def apiserver_process(self) -> ManagedProcess | None:
        """The API server's process, for components that stop waiting when it dies."""
        return self._apiserver.process if self._apiserver is not None else None

    def _processes(self) -> list[ManagedProcess]:
        procs = [self.etcd_process, self.apiserver_process, *(s.process for s in self._schedulers)]
        return [p for p in procs if p is not None]

    @property
    def pids(self) -> dict[str, int]:
        """PIDs of the running processes by name (etcd, kube-apiserver, schedulers)."""
        return {p.name: p.pid for p in self._processes() if p.pid is not None}

    @property
    def running(self) -> bool:
        return self._started

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LocalControlPlane:
        """Start etcd and kube-apiserver and wait until ``/readyz`` answers 200.

        On any failure everything started so far is stopped and the work dir (etcd's data
        with it) removed before the error propagates.
        """
        with self._lock:
            if self._started:
                return self
            etcd_bin = require_tool("etcd")
            apiserver_bin = require_tool("kube-apiserver")
            atexit.register(self.stop)
            try:
                _remove_stale_workdirs(self._base_dir)
                workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=self._base_dir))
                self._workdir = workdir
                (workdir / OWNER_FILE).write_text(f"{os.getpid()}\n")
                pki = self.pki.write(KUBERNETES_SERVICE_IP)
                self._etcd = Etcd(etcd_bin, workdir, self.extra_etcd_flags)
                self._etcd.start(self.startup_timeout)
                self._apiserver = APIServer(
                    apiserver_bin, workdir, pki, self._etcd.url, self.extra_apiserver_flags
                )
                kubeconfig.write_kubeconfig(self.kubeconfig_path, self.kubeconfig_yaml())
                self._apiserver.start(self.startup_timeout, watch=[self._etcd.process])
                self._started = True
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop every process (schedulers, apiserver, etcd) and remove the temp dir.

        Safe to call more than once.
        """
        with self._lock:
            for scheduler in list(self._schedulers):
                scheduler.process.stop()
            self._schedulers.clear()
            if self._apiserver is not None:
                self._apiserver.stop()
            if self._etcd is not None:
                self._etcd.stop()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            self._started = False
            atexit.unregister(self.stop)

    def restart_apiserver(self, down_seconds: float = 0.0) -> None:
        """Stop kube-apiserver, wait `down_seconds`, start it again on the same port (an
        upgrade or a crash of the API server, as clients see it)."""
        assert self._apiserver is not None and self._etcd is not None, "not started"
        self._apiserver.restart(self.startup_timeout, down_seconds, watch=[self._etcd.process])

    def restart_etcd(self, down_seconds: float = 0.0) -> None:
        """Stop etcd, wait `down_seconds`, start it again on its ports and data; returns once
        the API server is ready again."""
        assert self._etcd is not None and self._apiserver is not None, "not started"
        self._etcd.restart(down_seconds)
        self._apiserver.wait_ready(self.startup_timeout, watch=[self._etcd.process])

    def logs(self) -> dict[str, str]:
        """Last log lines of every process, keyed by process name."""
        return {p.name: p.tail() for p in self._processes()}

    # ----------------------------------------------------------------- access
    def kubeconfig_yaml(self, user: Mapping[str, str] | None = None) -> str:
        """An admin (system:masters) kubeconfig with the credentials embedded.

        ``user`` replaces the admin credentials, e.g. ``{"token": "..."}``.
        """
        pki = self.pki
        return kubeconfig.kubeconfig_yaml(self.server, pki.ca, pki.admin_cert, pki.admin_key, user)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client cert."""
        if self._apiserver is None:
            raise ControlPlaneError("control plane not started")
        return self._apiserver.ssl_context()

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        """JSON request to the API server as admin; returns the decoded response.

        Raises :class:`urllib.error.HTTPError` on non-2xx answers.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            content_type = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
            req.add_header("Content-Type", content_type)
        with no_proxy_opener(self.ssl_context()).open(req, timeout=timeout) as resp:
            raw = resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        """``GET path`` as admin, e.g. ``cp.get("/version")["gitVersion"]``."""
        return self.request("GET", path)

    def create_namespace(self, name: str, *, default_service_account: bool = True) -> None:
        """Create a namespace, plus its ``default`` ServiceAccount.

        There is no kube-controller-manager, so nothing else creates the
        ``default`` ServiceAccount, and the ServiceAccount admission plugin
        rejects pods whose service account does not exist.
        """
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        if default_service_account:
            self.request(
                "POST",
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"metadata": {"name": "default"}},
            )

    def create_node(
        self,
        name: str,
        *,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] = (),
    ) -> Any:
        """Create a schedulable, Ready Node object (there is no kubelet) and return it.

        The TaintNodesByCondition admission plugin gives every new Node the
        ``node.kubernetes.io/not-ready:NoSchedule`` taint and nothing here runs
        the node lifecycle controller that would remove it, so the Node's taints
        are reset to exactly ``taints``. Status gets a Ready condition and
        ``capacity`` (default: 4 CPUs, 8Gi memory, 110 pods) as capacity and
        allocatable.
        """
        capacity = dict(capacity or {"cpu": "4", "memory": "8Gi", "pods": "110"})
        metadata: dict[str, Any] = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        self.request("POST", "/api/v1/nodes", {"metadata": metadata})
        self.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": list(taints) or None}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "node created by tools.harness",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        status = {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}
        return self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status})

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` for the admin kubeconfig (needs the client lib)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path))

    # -------------------------------------------------------------- scheduler
    def start_scheduler(
        self,
        config_yaml: str = "",
        *,
        extra_flags: Sequence[str] = (),
        timeout: float = 60.0,
        wait_ready: bool = True,
        binary: str = "kube-scheduler",
    ) -> SchedulerHandle:
        """Start kube-scheduler against this API server and wait for ``/healthz``.

        ``binary`` is the tool to run: kube-scheduler, or gpu-binpack-scheduler
        (kube-scheduler with the GpuFragmentation and GpuClaimBinpack plugins, from
        scheduler/).

        ``config_yaml`` is a ``KubeSchedulerConfiguration`` document (empty: the
        default profile; see :func:`.scheduler.scheduler_config`). With ``wait_ready``
        the call also waits until ``/readyz`` answers 200 (informers synced).
        """
        scheduler_bin = require_tool(binary)
        with self._lock:
            if not self._started:
                raise ControlPlaneError("control plane not started")
            index = len(list(self.workdir.glob("kube-scheduler-*")))
            handle = start_scheduler(
                scheduler_bin,
                "kube-scheduler" if index == 0 else f"kube-scheduler-{index}",
                self.workdir / f"kube-scheduler-{index}",
                config_yaml,
                self.kubeconfig_path,
                (self.admin_cert_path, self.admin_key_path),
                extra_flags=extra_flags,
                timeout=timeout,
                wait_ready=wait_ready,
                watch=[self.apiserver_process],
                on_stop=self._forget_scheduler,
            )
            self._schedulers.append(handle)
            return handle

    def _forget_scheduler(self, handle: SchedulerHandle) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._schedulers.remove(handle)
