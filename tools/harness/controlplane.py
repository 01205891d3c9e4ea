"""Run a throw-away etcd + kube-apiserver (+ kube-scheduler) on 127.0.0.1.

The binaries come from ``tools/build-tools.sh`` (``.tools/bin`` or
``$GPU_CLUSTER_TOOLS_BIN``). Every process runs in its own process group and is
killed together with its group on :meth:`LocalControlPlane.stop`, at interpreter
exit, and (on Linux, when started from the main thread) when the Python process
dies, so a failed or interrupted test run leaves no processes behind.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

import yaml

from . import certs

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN_ENV = "GPU_CLUSTER_TOOLS_BIN"
CONTROL_PLANE_TOOLS = ("etcd", "kube-apiserver")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"
LOG_TAIL_LINES = 40
WORKDIR_PREFIX = "gpu-cluster-cp-"
OWNER_FILE = "owner.pid"


class ControlPlaneError(RuntimeError):
    """A control plane process failed to start or died."""


class ToolNotFoundError(ControlPlaneError):
    """A required binary has not been built."""


def tools_bin() -> Path:
    """Directory holding the built tools: ``$GPU_CLUSTER_TOOLS_BIN`` or ``<repo>/.tools/bin``."""
    env = os.environ.get(TOOLS_BIN_ENV)
    return Path(env) if env else REPO_ROOT / ".tools" / "bin"


def find_tool(name: str) -> Path | None:
    """Path of the built tool ``name``, or None if it is missing or not executable.

    A ``.yaml`` name is a data file the build installs beside the binaries (kwok's stages).
    """
    path = tools_bin() / name
    usable = path.suffix == ".yaml" or os.access(path, os.X_OK)
    return path if path.is_file() and usable else None


def missing_tools(names: Iterable[str] = CONTROL_PLANE_TOOLS) -> list[str]:
    """The subset of ``names`` that has not been built."""
    return [name for name in names if find_tool(name) is None]


def require_tool(name: str) -> Path:
    """Like :func:`find_tool` but raises :class:`ToolNotFoundError`."""
    path = find_tool(name)
    if path is None:
        raise ToolNotFoundError(
            f"{name} not built in {tools_bin()}: run `make tools` (tools/build-tools.sh)"
        )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


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


def _die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the child gets SIGKILL when this process dies (Linux, setpriv).

    util-linux's setpriv sets PR_SET_PDEATHSIG and execs the command (same pid). It replaces a
    preexec_fn: that forces fork() and runs Python in the child, where the pthread_atfork
    handlers of the gRPC threads the Pulumi engine leaves in this process abort it now and then
    (SIGABRT, "epoll_wait error: Bad file descriptor") before the command starts; without one,
    subprocess uses vfork and no handler runs. PR_SET_PDEATHSIG fires when the *thread* that
    started the child exits, so it is only asked for from the main thread. Without setpriv the
    command runs as it is (the stale-workdir sweep still reaps what a killed run leaves).
    """
    setpriv = shutil.which("setpriv")
    if (
        setpriv is None
        or not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


class Lifecycle:
    """`with x:` for objects with start() (returning self) and stop()."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ManagedProcess:
    """A child process in its own process group with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self._log = self.log_path.open("ab")
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        self._popen = subprocess.Popen(
            _die_with_parent(self.argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own session + process group (pgid == pid)
        )

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        popen, self._popen = self._popen, None
        if popen is not None:
            pgid = popen.pid
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=grace)
            # Whatever is left of the group (the leader, or anything it forked).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def _no_proxy_opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


class SchedulerHandle:
    """A running kube-scheduler started by :meth:`LocalControlPlane.start_scheduler`."""

    def __init__(
        self, process: ManagedProcess, config_path: Path, secure_port: int, owner: LocalControlPlane
    ) -> None:
        self._process = process
        self.config_path = config_path
        self.secure_port = secure_port
        self._owner = owner

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def running(self) -> bool:
        return self._process.running()

    def log(self) -> str:
        """The scheduler's full log so far."""
        return self._process.log()

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self._process.tail(lines)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET ``path`` (e.g. ``/readyz``, ``/metrics``) from the scheduler's secure port.

        The scheduler serves a self-signed certificate, so it is not verified;
        the admin client certificate is presented (needed for ``/metrics``).
        """
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(self._owner.admin_cert_path, self._owner.admin_key_path)
        url = f"https://127.0.0.1:{self.secure_port}{path}"
        try:
            with _no_proxy_opener(context).open(url, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    def stop(self) -> None:
        self._process.stop()
        self._owner._forget_scheduler(self)

    def __enter__(self) -> SchedulerHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None
        self._schedulers: list[SchedulerHandle] = []
        self._started = False
        self.etcd_client_port = 0
        self.etcd_peer_port = 0
        self.secure_port = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ paths
    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("control plane not started")
        return self._workdir

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_path(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def admin_cert_path(self) -> Path:
        return self.pki_dir / "admin.crt"

    @property
    def admin_key_path(self) -> Path:
        return self.pki_dir / "admin.key"

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:40123``."""
        return f"https://127.0.0.1:{self.secure_port}"

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
    def pids(self) -> dict[str, int]:
        """PIDs of the running processes by name (etcd, kube-apiserver, schedulers)."""
        procs = [self._etcd, self._apiserver, *(s._process for s in self._schedulers)]
        return {p.name: p.pid for p in procs if p is not None and p.pid is not None}

    @property
    def running(self) -> bool:
        return self._started

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LocalControlPlane:
        """Start etcd and kube-apiserver and wait until ``/readyz`` answers 200."""
        with self._lock:
            if self._started:
                return self
            etcd_bin = require_tool("etcd")
            apiserver_bin = require_tool("kube-apiserver")
            atexit.register(self.stop)
            try:
                _remove_stale_workdirs(self._base_dir)
                self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=self._base_dir))
                (self._workdir / OWNER_FILE).write_text(f"{os.getpid()}\n")
                self._write_pki()
                self._start_etcd(etcd_bin)
                self._start_apiserver(apiserver_bin)
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
                scheduler._process.stop()
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

    # ---------------------------------------------------------------- startup
    def _write_pki(self) -> None:
        pki = self.pki_dir
        pki.mkdir(mode=0o700)
        ca = certs.CertificateAuthority()
        self.ca_path.write_bytes(ca.cert_pem)
        serving = ca.issue(
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", "::1", "10.96.0.1"],
            server=True,
        )
        (pki / "apiserver.crt").write_bytes(serving.cert_pem)
        certs.write_private(pki / "apiserver.key", serving.key_pem)
        admin = ca.issue("admin", organizations=["system:masters"], client=True)
        self.admin_cert_path.write_bytes(admin.cert_pem)
        certs.write_private(self.admin_key_path, admin.key_pem)
        # Aggregation layer / request-header authentication, as kubeadm sets it up
        # (separate front-proxy CA); also silences "missing content for CA
        # bundle" errors from components that read extension-apiserver-authentication.
        front_proxy_ca = certs.CertificateAuthority("gpu-cluster-test-front-proxy-ca")
        (pki / "front-proxy-ca.crt").write_bytes(front_proxy_ca.cert_pem)
        front_proxy = front_proxy_ca.issue("front-proxy-client", client=True)
        (pki / "front-proxy-client.crt").write_bytes(front_proxy.cert_pem)
        certs.write_private(pki / "front-proxy-client.key", front_proxy.key_pem)
        sa_key, sa_pub = certs.service_account_key_pair()
        certs.write_private(pki / "sa.key", sa_key)
        (pki / "sa.pub").write_bytes(sa_pub)

    def _start_etcd(self, etcd_bin: Path) -> None:
        self.etcd_client_port = free_port()
        self.etcd_peer_port = free_port()
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(etcd_bin),
            "--name=local",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--initial-cluster-state=new",
            # Throw-away data: skip fsync, it dominates latency on slow disks.
            "--unsafe-no-fsync=true",
            *self.extra_etcd_flags,
        ]
        self._etcd = ManagedProcess("etcd", argv, self.etcd_log_path)
        self._etcd.start()
        self._wait(
            "etcd",
            lambda: self._http_ok(f"{self.etcd_url}/health", None),
            [self._etcd],
        )

    def apiserver_argv(self, apiserver_bin: Path) -> list[str]:
        pki = self.pki_dir
        defaults = [
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.secure_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--client-ca-file={self.ca_path}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            # The "kubernetes" Service cannot have a loopback endpoint; without
            # this the apiserver logs an Endpoints validation error every 10 s.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ]
        overridden = {_flag_name(flag) for flag in self.extra_apiserver_flags}
        kept = [flag for flag in defaults if _flag_name(flag) not in overridden]
        return [str(apiserver_bin), *kept, *self.extra_apiserver_flags]

    def _start_apiserver(self, apiserver_bin: Path) -> None:
        self.secure_port = free_port()
        self._write_kubeconfig()
        self._launch_apiserver(apiserver_bin)

    def _launch_apiserver(self, apiserver_bin: Path) -> None:
        """kube-apiserver on `secure_port`; returns once `/readyz` answers 200."""
        self._apiserver = ManagedProcess(
            "kube-apiserver", self.apiserver_argv(apiserver_bin), self.apiserver_log_path
        )
        self._apiserver.start()
        self._wait_apiserver_ready()

    def _wait_apiserver_ready(self) -> None:
        context = self.ssl_context()
        self._wait(
            "kube-apiserver",
            lambda: self._http_ok(f"{self.server}/readyz", context),
            [self._etcd, self._apiserver],
        )

    def restart_apiserver(self, down_seconds: float = 0.0) -> None:
        """Stop kube-apiserver, wait `down_seconds`, start it again on the same port (an
        upgrade or a crash of the API server, as clients see it)."""
        assert self._apiserver is not None, "not started"
        self._apiserver.stop()
        time.sleep(down_seconds)
        self._launch_apiserver(require_tool("kube-apiserver"))

    def restart_etcd(self, down_seconds: float = 0.0) -> None:
        """Stop etcd, wait `down_seconds`, start it again on its ports and data; returns once
        the API server is ready again."""
        assert self._etcd is not None and self._apiserver is not None, "not started"
        argv = self._etcd.argv
        self._etcd.stop()
        time.sleep(down_seconds)
        self._etcd = ManagedProcess("etcd", argv, self.etcd_log_path)
        self._etcd.start()
        self._wait_apiserver_ready()

    def _write_kubeconfig(self) -> None:
        self.kubeconfig_path.write_text(self.kubeconfig_yaml())
        self.kubeconfig_path.chmod(0o600)

    def kubeconfig_yaml(self, user: Mapping[str, str] | None = None) -> str:
        """An admin (system:masters) kubeconfig with the credentials embedded.

        ``user`` replaces the admin credentials, e.g. ``{"token": "..."}``.
        """
        import base64

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        credentials = (
            dict(user)
            if user is not None
            else {
                "client-certificate-data": b64(self.admin_cert_path),
                "client-key-data": b64(self.admin_key_path),
            }
        )

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.ca_path),
                    },
                }
            ],
            "users": [{"name": "admin", "user": credentials}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
            "preferences": {},
        }
        return yaml.safe_dump(config, sort_keys=False)

    @staticmethod
    def _http_ok(url: str, context: ssl.SSLContext | None) -> bool:
        try:
            with _no_proxy_opener(context).open(url, timeout=5) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def _wait(
        self,
        what: str,
        ready: Callable[[], bool],
        processes: Sequence[ManagedProcess | None],
        timeout: float | None = None,
    ) -> None:
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            for proc in processes:
                if proc is not None and not proc.running():
                    raise ControlPlaneError(
                        f"{proc.name} exited with code {proc.returncode} while waiting for"
                        f" {what}\n{self._log_report(processes)}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{what} not ready after {timeout:.0f} s\n{self._log_report(processes)}"
                )
            time.sleep(0.2)

    @staticmethod
    def _log_report(processes: Sequence[ManagedProcess | None]) -> str:
        parts = []
        for proc in processes:
            if proc is not None:
                parts.append(
                    f"--- last {LOG_TAIL_LINES} lines of {proc.name} log ({proc.log_path}) ---\n"
                    f"{proc.tail()}"
                )
        return "\n".join(parts)

    def logs(self) -> dict[str, str]:
        """Last log lines of every process, keyed by process name."""
        procs = [self._etcd, self._apiserver, *(s._process for s in self._schedulers)]
        return {p.name: p.tail() for p in procs if p is not None}

    # ----------------------------------------------------------------- access
    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client cert."""
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(str(self.admin_cert_path), str(self.admin_key_path))
        return context

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
        with _no_proxy_opener(self.ssl_context()).open(req, timeout=timeout) as resp:
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

        ``binary`` is the built tool to run: kube-scheduler, or gpu-binpack-scheduler
        (kube-scheduler with the GpuFragmentation plugin, from scheduler/).

        ``config_yaml`` is a ``KubeSchedulerConfiguration`` document (empty: the
        default profile). kube-scheduler ignores ``--kubeconfig`` when
        ``--config`` is given, so ``clientConnection.kubeconfig`` is set to the
        admin kubeconfig unless the document sets it; ``leaderElection.leaderElect``
        defaults to false. With ``wait_ready`` the call also waits until
        ``/readyz`` answers 200 (informers synced).
        """
        scheduler_bin = require_tool(binary)
        with self._lock:
            if not self._started:
                raise ControlPlaneError("control plane not started")
            index = len(list(self.workdir.glob("kube-scheduler-*")))
            sched_dir = self.workdir / f"kube-scheduler-{index}"
            sched_dir.mkdir()
            config: dict[str, Any] = yaml.safe_load(config_yaml) or {}
            if not isinstance(config, dict):
                raise ValueError("config_yaml must be a single KubeSchedulerConfiguration mapping")
            config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
            config.setdefault("kind", "KubeSchedulerConfiguration")
            client_connection = config.setdefault("clientConnection", {})
            client_connection.setdefault("kubeconfig", str(self.kubeconfig_path))
            config.setdefault("leaderElection", {}).setdefault("leaderElect", False)
            config_path = sched_dir / "config.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            port = free_port()
            argv = [
                str(scheduler_bin),
                f"--config={config_path}",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                *extra_flags,
            ]
            name = "kube-scheduler" if index == 0 else f"kube-scheduler-{index}"
            process = ManagedProcess(name, argv, sched_dir / "kube-scheduler.log")
            handle = SchedulerHandle(process, config_path, port, self)
            self._schedulers.append(handle)
            try:
                process.start()

                def healthy() -> bool:
                    try:
                        return handle.get("/healthz", timeout=2)[0] == 200 and (
                            not wait_ready or handle.get("/readyz", timeout=2)[0] == 200
                        )
                    except (OSError, urllib.error.URLError, ssl.SSLError):
                        return False

                self._wait(name, healthy, [self._apiserver, process], timeout=timeout)
            except BaseException:
                handle.stop()
                raise
            return handle

    def _forget_scheduler(self, handle: SchedulerHandle) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._schedulers.remove(handle)
