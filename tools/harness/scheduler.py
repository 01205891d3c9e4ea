"""kube-scheduler (or the project's gpu-binpack-scheduler) against a local API server."""

from __future__ import annotations

import ssl
import urllib.error
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from .child_process import (
    LOG_TAIL_LINES,
    ManagedProcess,
    free_port,
    no_proxy_opener,
    wait_until,
)


class SchedulerHandle:
    """A running kube-scheduler started by :func:`start_scheduler`."""

    def __init__(
        self,
        process: ManagedProcess,
        config_path: Path,
        secure_port: int,
        client_cert: tuple[Path, Path],
        on_stop: Callable[[SchedulerHandle], None] = lambda handle: None,
    ) -> None:
        self._process = process
        self.config_path = config_path
        self.secure_port = secure_port
        self._client_cert = client_cert
        self._on_stop = on_stop

    @property
    def process(self) -> ManagedProcess:
        return self._process

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
        context.load_cert_chain(*self._client_cert)
        url = f"https://127.0.0.1:{self.secure_port}{path}"
        try:
            with no_proxy_opener(context).open(url, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    def stop(self) -> None:
        self._process.stop()
        self._on_stop(self)

    def __enter__(self) -> SchedulerHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def scheduler_config(config_yaml: str, kubeconfig: Path) -> dict[str, Any]:
    """``config_yaml`` (a KubeSchedulerConfiguration, empty: the default profile) completed:
    kube-scheduler ignores ``--kubeconfig`` when ``--config`` is given, so
    ``clientConnection.kubeconfig`` is set unless the document sets it, and
    ``leaderElection.leaderElect`` defaults to false."""
    config: dict[str, Any] = yaml.safe_load(config_yaml) or {}
    if not isinstance(config, dict):
        raise ValueError("config_yaml must be a single KubeSchedulerConfiguration mapping")
    config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    config.setdefault("kind", "KubeSchedulerConfiguration")
    config.setdefault("clientConnection", {}).setdefault("kubeconfig", str(kubeconfig))
    config.setdefault("leaderElection", {}).setdefault("leaderElect", False)
    return config


def start_scheduler(
    binary: Path,
    name: str,
    directory: Path,
    config_yaml: str,
    kubeconfig: Path,
    client_cert: tuple[Path, Path],
    *,
    extra_flags: Sequence[str] = (),
    timeout: float,
    wait_ready: bool,
    watch: Sequence[ManagedProcess | None] = (),
    on_stop: Callable[[SchedulerHandle], None] = lambda handle: None,
) -> SchedulerHandle:
    """Start the scheduler in ``directory`` and wait for ``/healthz`` (and ``/readyz``, its
    informers synced, with ``wait_ready``); stopped again if it does not get there."""
    directory.mkdir()
    config_path = directory / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(scheduler_config(config_yaml, kubeconfig), sort_keys=False)
    )
    port = free_port()
    argv = [
        str(binary),
        f"--config={config_path}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        *extra_flags,
    ]
    process = ManagedProcess(name, argv, directory / "kube-scheduler.log")
    handle = SchedulerHandle(process, config_path, port, client_cert, on_stop)
    try:
        process.start()

        def healthy() -> bool:
            try:
                return handle.get("/healthz", timeout=2)[0] == 200 and (
                    not wait_ready or handle.get("/readyz", timeout=2)[0] == 200
                )
            except (OSError, urllib.error.URLError, ssl.SSLError):
                return False

        wait_until(name, healthy, [*watch, process], timeout)
    except BaseException:
        handle.stop()
        raise
    return handle
