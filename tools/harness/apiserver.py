"""kube-apiserver for a local control plane: 127.0.0.1, the plane's certificates, its etcd."""

from __future__ import annotations

import ipaddress
import ssl
import time
from collections.abc import Sequence
from pathlib import Path

from .certs import ControlPlanePki
from .child_process import ManagedProcess, free_port, http_ok, wait_until

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"
KUBERNETES_SERVICE_IP = str(ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE).network_address + 1)
"""The ``kubernetes`` Service's address: the first of the range, as the API server picks it."""


def flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


class APIServer:
    """kube-apiserver on a free port, as kubeadm configures it where it matters to the tests.

    ``extra_flags`` are appended to the command line; a default flag with the same name (e.g.
    ``--authorization-mode``) is dropped so that the extra flag replaces it rather than being
    merged with it.
    """

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        pki: ControlPlanePki,
        etcd_url: str,
        extra_flags: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.pki = pki
        self.etcd_url = etcd_url
        self.extra_flags = list(extra_flags)
        self.log_path = workdir / "kube-apiserver.log"
        self.secure_port = free_port()
        self.process: ManagedProcess | None = None

    @property
    def server(self) -> str:
        """The URL, e.g. ``https://127.0.0.1:40123``."""
        return f"https://127.0.0.1:{self.secure_port}"

    def argv(self) -> list[str]:
        pki = self.pki
        defaults = [
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.secure_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--client-ca-file={pki.ca}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--requestheader-client-ca-file={pki.front_proxy_ca}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            # The "kubernetes" Service cannot have a loopback endpoint; without
            # this the apiserver logs an Endpoints validation error every 10 s.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ]
        overridden = {flag_name(flag) for flag in self.extra_flags}
        kept = [flag for flag in defaults if flag_name(flag) not in overridden]
        return [str(self.binary), *kept, *self.extra_flags]

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client cert."""
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def start(self, timeout: float, watch: Sequence[ManagedProcess | None] = ()) -> None:
        """Start and wait until ``/readyz`` answers 200; fails early if the API server or one
        of ``watch`` (its etcd) exits."""
        self.process = ManagedProcess("kube-apiserver", self.argv(), self.log_path)
        self.process.start()
        self.wait_ready(timeout, watch)

    def wait_ready(self, timeout: float, watch: Sequence[ManagedProcess | None] = ()) -> None:
        context = self.ssl_context()
        wait_until(
            "kube-apiserver",
            lambda: http_ok(f"{self.server}/readyz", context),
            [*watch, self.process],
            timeout,
        )

    def restart(
        self, timeout: float, down_seconds: float = 0.0, watch: Sequence[ManagedProcess | None] = ()
    ) -> None:
        """Stop, wait ``down_seconds``, start again on the same port (an upgrade or a crash of
        the API server, as clients see it)."""
        self.stop()
        time.sleep(down_seconds)
        self.start(timeout, watch)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
