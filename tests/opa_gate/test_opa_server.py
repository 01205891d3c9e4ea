"""The admission policy served by a real `opa run --server` over TLS, as the API server calls it.

OPA gets the policies without their tests and the gate configuration at
data.gpu_cluster.config (a `<dotted-path>:<file>` argument), HTTPS on the main listener and
/health on a plain-HTTP diagnostic listener, and no authorization policy, so the data API
can be inspected. AdmissionReviews are POSTed to `/`, OPA's default decision (data.system.main).
tests/integration/test_opa_gate_live.py starts OPA exactly as the Deployment does
(authorization, policies and config read from mounted files) behind the real kube-apiserver.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import built_tool
from tools.harness import free_port
from tools.harness.certs import CertificateAuthority, write_private

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "components" / "opa_gate" / "policies"
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 30.0

# The parameter document (components/opa_gate/manifests.py gate_data()): lists comma-separated.
GATE_CONFIG = {
    "scheduler_name": "gpu-binpack-scheduler",
    "gpu_resources": "nvidia.com/gpu,example.com/dongle",
    "gpu_resource_prefixes": "nvidia.com/mig-",
}
REVIEW_UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class OpaServer:
    url: str
    ca_cert: Path

    def post(self, path: str, document: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(document).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        return self._send(request)

    def get(self, path: str) -> dict[str, Any]:
        return self._send(urllib.request.Request(self.url + path, method="GET"))

    def _send(self, request: urllib.request.Request) -> dict[str, Any]:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            body: dict[str, Any] = json.load(response)
            return body


def _write_tls_files(directory: Path) -> TlsFiles:
    """A throwaway CA and a serving certificate for 127.0.0.1 signed by it."""
    ca = CertificateAuthority("gpu-cluster opa test CA")
    serving = ca.issue("opa", ip_addresses=[LOOPBACK], server=True)
    files = TlsFiles(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "tls.crt",
        server_key=directory / "tls.key",
    )
    files.ca_cert.write_bytes(ca.cert_pem)
    files.server_cert.write_bytes(serving.cert_pem)
    write_private(files.server_key, serving.key_pem)
    return files


def _wait_until_healthy(process: subprocess.Popen[bytes], health_url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"opa exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(health_url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    pytest.fail(f"opa not healthy after {STARTUP_TIMEOUT_S}s:\n{log.read_text()}")


def opa_argv(opa: Path, tls: TlsFiles, gate_config: Path, port: int, diag_port: int) -> list[str]:
    """How the webhook's OPA is started: policies without tests, config at its data path."""
    policies = sorted(p for p in POLICIES.glob("*.rego") if not p.name.endswith("_test.rego"))
    return [
        str(opa),
        "run",
        "--server",
        f"--addr=https://{LOOPBACK}:{port}",
        f"--diagnostic-addr=http://{LOOPBACK}:{diag_port}",
        f"--tls-cert-file={tls.server_cert}",
        f"--tls-private-key-file={tls.server_key}",
        "--skip-version-check",
        "--log-level=error",
        *(str(p) for p in policies),
        f"gpu_cluster.config:{gate_config}",
    ]


@pytest.fixture(scope="module")
def opa() -> Path:
    """The harness's OPA: skipped when not built, a failure under CI=true."""
    return built_tool("opa")


@pytest.fixture(scope="module")
def opa_server(opa: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaServer]:
    workdir = tmp_path_factory.mktemp("opa-server")
    tls = _write_tls_files(workdir)
    gate_config = workdir / "gate.json"
    gate_config.write_text(json.dumps(GATE_CONFIG))
    port, diag_port = free_port(), free_port()
    log = workdir / "opa.log"

    with log.open("wb") as log_file:
        process = subprocess.Popen(
            opa_argv(opa, tls, gate_config, port, diag_port),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_until_healthy(process, f"http://{LOOPBACK}:{diag_port}/health", log)
            yield OpaServer(url=f"https://{LOOPBACK}:{port}", ca_cert=tls.ca_cert)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _pod_review(limits: dict[str, str], scheduler_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "registry.example/train:1", "resources": {"limits": limits}}
        ]
    }
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": REVIEW_UID,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "name": "train-0",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "train-0", "namespace": "team-a"},
                "spec": spec,
            },
        },
    }


def test_opa_server_denies_gpu_pod_without_scheduler_name(opa_server: OpaServer) -> None:
    review = opa_server.post("/", _pod_review({"nvidia.com/gpu": "1"}, None))

    assert review == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": REVIEW_UID,
            "allowed": False,
            "status": {
                "code": 403,
                "message": 'pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName'
                " is unset; GPU pods must set spec.schedulerName: gpu-binpack-scheduler",
            },
        },
    }


def test_opa_server_denies_gpu_pod_on_default_scheduler(opa_server: OpaServer) -> None:
    review = opa_server.post("/", _pod_review({"nvidia.com/gpu": "1"}, "default-scheduler"))

    assert review["response"]["status"]["message"] == (
        'pod "team-a/train-0" requests nvidia.com/gpu but spec.schedulerName is'
        ' "default-scheduler"; GPU pods must set spec.schedulerName: gpu-binpack-scheduler'
    )


def test_opa_server_allows_gpu_pod_with_binpack_scheduler(opa_server: OpaServer) -> None:
    review = opa_server.post("/", _pod_review({"nvidia.com/gpu": "1"}, "gpu-binpack-scheduler"))

    assert review["response"] == {"uid": REVIEW_UID, "allowed": True}


def test_opa_server_allows_cpu_only_pod(opa_server: OpaServer) -> None:
    review = opa_server.post("/", _pod_review({"cpu": "1"}, None))

    assert review["response"] == {"uid": REVIEW_UID, "allowed": True}


def test_opa_server_gates_configured_extended_resource(opa_server: OpaServer) -> None:
    review = opa_server.post("/", _pod_review({"example.com/dongle": "1"}, None))

    assert review["response"]["allowed"] is False
    assert review["response"]["status"]["message"].startswith(
        'pod "team-a/train-0" requests example.com/dongle but'
    )


def test_opa_server_denies_review_without_request(opa_server: OpaServer) -> None:
    review = opa_server.post("/", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})

    assert review == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "",
            "allowed": False,
            "status": {
                "code": 403,
                "message": "malformed AdmissionReview: input.request is missing or not an object",
            },
        },
    }


def test_opa_server_loads_config_at_data_path(opa_server: OpaServer) -> None:
    assert opa_server.get("/v1/data/gpu_cluster/config") == {"result": GATE_CONFIG}


def test_opa_server_loads_no_test_files(opa_server: OpaServer) -> None:
    policy_ids = [policy["id"] for policy in opa_server.get("/v1/policies")["result"]]

    assert policy_ids
    assert not [p for p in policy_ids if p.endswith("_test.rego")]
