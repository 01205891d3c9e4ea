"""kube-controller-manager against a local API server, as kubeadm runs it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .certs import ControlPlanePki
from .child_process import ManagedProcess, free_port, http_ok, unverified_context, wait_until


class ControllerManager:
    """Every controller, each with its own ServiceAccount's credentials."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        kubeconfig: Path,
        pki: ControlPlanePki,
        extra_flags: Sequence[str] = (),
    ):
        self.binary = binary
        self.extra_flags = list(extra_flags)
        self.kubeconfig = kubeconfig
        self.pki = pki
        self.log_path = workdir / "kube-controller-manager.log"
        self.secure_port = 0
        self.process: ManagedProcess | None = None

    def argv(self) -> list[str]:
        kubeconfig = str(self.kubeconfig)
        return [
            str(self.binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            "--leader-elect=false",
            # As kubeadm runs it: every controller with its own ServiceAccount's credentials.
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--root-ca-file={self.pki.ca}",
            f"--service-account-private-key-file={self.pki.service_account_key}",
            "--profiling=false",
            *self.extra_flags,
        ]

    def start(self, timeout: float, watch: Sequence[ManagedProcess | None] = ()) -> None:
        """Start and wait until ``/healthz`` answers 200."""
        self.secure_port = free_port()
        self.process = ManagedProcess("kube-controller-manager", self.argv(), self.log_path)
        self.process.start()
        url = f"https://127.0.0.1:{self.secure_port}/healthz"
        context = unverified_context()
        wait_until(
            "kube-controller-manager",
            lambda: http_ok(url, context),
            [*watch, self.process],
            timeout,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
