"""The gate's engines in force on a real kube-apiserver, for the live gate tests.

Everything the API server gets is built by the component's own functions: the webhook
(webhook_spec, pointed at a local OPA through clientConfig.url instead of the in-cluster
Service), OPA's arguments and files (opa_run_args, policy_files), laid out as the kubelet
mounts a ConfigMap, the ValidatingAdmissionPolicy, the MutatingAdmissionPolicy and their
bindings. Nothing is ever pushed into OPA: it decides from the files it read at start-up.
An engine is in force only inside engine_active(), which removes it again (and waits until the
API server has forgotten it) even when the test fails. Used by test_opa_gate_live.py and
test_gate_tolerations_live.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.opa_gate.manifests import (
    GATE_CONFIG_FILE,
    admission_policy_binding_spec,
    admission_policy_spec,
    opa_run_args,
    policy_files,
    routing_binding_spec,
    routing_policy_spec,
    webhook_spec,
)
from components.opa_gate.settings import GATE_NAME, ROUTING_ENGINE, WEBHOOK_NAME, load_policies
from tests.integration.conftest import built_tool
from tools.harness import LocalControlPlane, ManagedProcess, free_port
from tools.harness.certs import CertificateAuthority, write_private

LOOPBACK = "127.0.0.1"
CPU = {"cpu": "1"}
GPU = {"cpu": "1", "nvidia.com/gpu": "1"}
# Until OPA answers, a new gate is in force, or a removed one is forgotten.
TIMEOUT_S = 30.0
POLL_S = 0.25
API = "/apis/admissionregistration.k8s.io/v1"

# How the API server reports each engine's denial: (prefix of Status.message, policy message).
DENIAL = {
    "opa": re.compile(
        rf"^admission webhook \"{re.escape(WEBHOOK_NAME)}\" denied the request: (?P<message>.*)$"
    ),
    "validating-admission-policy": re.compile(
        r"^pods \"[^\"]+\" is forbidden: ValidatingAdmissionPolicy"
        rf" '{GATE_NAME}' with binding '{GATE_NAME}' denied request: (?P<message>.*)$"
    ),
}
# The routing engine refuses through the same ValidatingAdmissionPolicy.
DENIAL[ROUTING_ENGINE] = DENIAL["validating-admission-policy"]


@dataclass(frozen=True)
class Gate:
    """What an engine is registered with: the gate data (its parameter document, with the
    pool's taint the routing engine tolerates), written into the native policies and OPA's
    data, and the gate's own namespace (excluded by name)."""

    config: Mapping[str, str]
    namespace: str


@dataclass(frozen=True)
class OpaServer:
    """A running `opa run` with the gate's policies, data and authorization."""

    url: str
    ca_pem: bytes
    process: ManagedProcess

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def http_status(request: urllib.request.Request, context: ssl.SSLContext | None = None) -> int:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0  # not listening (yet)


def wait_for(what: str, check: Callable[[], bool], diagnose: Callable[[], str]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen within {TIMEOUT_S:.0f} s\n{diagnose()}", pytrace=False)
        time.sleep(POLL_S)


# ------------------------------------------------------------------------- OPA


def mount_like_configmap(directory: Path, files: Mapping[str, str]) -> None:
    """Lay out `files` as the kubelet mounts a ConfigMap volume.

    The data sits in a timestamped `..<date>` directory, `..data` links to it and each key
    is a link through `..data`, so a recursive loader finds every file three times.
    """
    directory.mkdir()
    stamped = directory / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir()
    for name, content in files.items():
        (stamped / name).write_text(content)
    (directory / "..data").symlink_to(stamped.name)
    for name in files:
        (directory / name).symlink_to(f"..data/{name}")


def opa_ready(server: OpaServer) -> bool:
    ready = urllib.request.Request(f"{server.url}/health/ready")
    return server.process.running() and http_status(ready, server.context()) == 200


@contextlib.contextmanager
def opa_serving(root: Path, config: Mapping[str, Any]) -> Iterator[OpaServer]:
    """OPA started as the Deployment starts it, from the same mounted files, with `config` as
    the gate data; ready when yielded, stopped afterwards."""
    opa = built_tool("opa")
    certs = root / "certs"
    certs.mkdir(parents=True)
    ca = CertificateAuthority("gpu-cluster opa-gate test CA")
    serving = ca.issue("opa", ip_addresses=[LOOPBACK], server=True)
    (certs / "tls.crt").write_bytes(serving.cert_pem)
    write_private(certs / "tls.key", serving.key_pem)
    mount_like_configmap(root / "policies", policy_files(load_policies()))
    mount_like_configmap(root / "config", {GATE_CONFIG_FILE: json.dumps(dict(config))})

    port = free_port()
    argv = opa_run_args(
        https_addr=f"{LOOPBACK}:{port}",
        certs_dir=str(certs),
        policy_dir=str(root / "policies"),
        config_dir=str(root / "config"),
    )
    process = ManagedProcess("opa", [str(opa), *argv], root / "opa.log")
    server = OpaServer(url=f"https://{LOOPBACK}:{port}", ca_pem=ca.cert_pem, process=process)
    process.start()
    try:
        # The readiness probe: anonymous GET over HTTPS, ready once policy and data are in.
        wait_for("OPA readiness (/health/ready)", lambda: opa_ready(server), process.tail)
        yield server
    finally:
        process.stop()


# ---------------------------------------------------------------- API server


def gpu_pod(
    name: str,
    limits: Mapping[str, str],
    *,
    scheduler: str | None = None,
    init_limits: Mapping[str, str] | None = None,
) -> client.V1Pod:
    """A pod whose one container (and init container) has `limits`."""

    def container(container_name: str, container_limits: Mapping[str, str]) -> client.V1Container:
        return client.V1Container(
            name=container_name,
            image="registry.invalid/train:1",
            resources=client.V1ResourceRequirements(limits=dict(container_limits)),
        )

    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            scheduler_name=scheduler,
            automount_service_account_token=False,
            containers=[container("main", limits)],
            init_containers=[container("warmup", init_limits)] if init_limits else None,
        ),
    )


def refusal(exc: ApiException) -> str | None:
    """The API server's Status.message of a refused request; None for other failures."""
    if exc.status not in (400, 403, 422, 500):
        return None
    message: str = json.loads(exc.body or "{}").get("message", str(exc))
    return message


def create(api_client: Any, namespace: str, pod: Any) -> str | None:
    """Dry-run create: None when admitted, else the API server's Status.message."""
    try:
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        message = refusal(exc)
        if message is None:
            raise
        return message
    return None


def admitted(api_client: Any, namespace: str, pod: Any) -> Any:
    """The pod as the API server would store it (dry run)."""
    created: Any = client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod, dry_run="All")
    return created


def denied_by(engine: str, outcome: str | None) -> bool:
    return outcome is not None and DENIAL[engine].match(outcome) is not None


@contextlib.contextmanager
def _webhook_engine(cp: LocalControlPlane, opa: OpaServer, gate: Gate) -> Iterator[None]:
    path = f"{API}/validatingwebhookconfigurations"
    hook = webhook_spec(
        config=gate.config,
        gate_namespace=gate.namespace,
        client_config={
            "url": f"{opa.url}/",
            "caBundle": base64.b64encode(opa.ca_pem).decode(),
        },
        failure_policy="Fail",
        timeout_seconds=5,
    )
    cp.request("POST", path, {"metadata": {"name": GATE_NAME}, "webhooks": [hook]})
    try:
        yield
    finally:
        cp.request("DELETE", f"{path}/{GATE_NAME}")


@contextlib.contextmanager
def _registered(cp: LocalControlPlane, kind: str, spec: Any, binding: Any) -> Iterator[None]:
    """An admission policy of `kind` and its binding, both named GATE_NAME."""
    policies, bindings = f"{API}/{kind}policies", f"{API}/{kind}policybindings"
    cp.request("POST", policies, {"metadata": {"name": GATE_NAME}, "spec": spec})
    try:
        cp.request("POST", bindings, {"metadata": {"name": GATE_NAME}, "spec": binding})
        try:
            yield
        finally:
            cp.request("DELETE", f"{bindings}/{GATE_NAME}")
    finally:
        cp.request("DELETE", f"{policies}/{GATE_NAME}")


def _policy_engine(cp: LocalControlPlane, gate: Gate) -> contextlib.AbstractContextManager[None]:
    return _registered(
        cp,
        "validatingadmission",
        admission_policy_spec(gate.config, gate_namespace=gate.namespace),
        admission_policy_binding_spec(gate_namespace=gate.namespace),
    )


@contextlib.contextmanager
def _routing_engine(cp: LocalControlPlane, gate: Gate) -> Iterator[None]:
    routing = _registered(
        cp,
        "mutatingadmission",
        routing_policy_spec(gate.config, gate_namespace=gate.namespace),
        routing_binding_spec(gate_namespace=gate.namespace),
    )
    with _policy_engine(cp, gate), routing:
        yield


@contextlib.contextmanager
def engine_active(
    engine: str,
    cp: LocalControlPlane,
    api_client: Any,
    namespace: str,
    gate: Gate,
    opa: OpaServer | None = None,
) -> Iterator[None]:
    """`engine` registered and in force; afterwards removed and no longer enforced.

    A GPU pod on a scheduler of its own is refused by every engine; the routing engine is
    in force once it also routes a GPU pod that names none. `opa` serves the opa engine.
    """
    probe = gpu_pod(f"probe-{uuid.uuid4().hex[:6]}", GPU, scheduler="team-scheduler")
    unrouted = gpu_pod(f"probe-{uuid.uuid4().hex[:6]}", GPU)
    last: list[str | None] = [None]

    def outcome() -> str | None:
        last[0] = create(api_client, namespace, probe)
        return last[0]

    def routed() -> bool:
        last[0] = create(api_client, namespace, unrouted)
        return last[0] is None

    def diagnose() -> str:
        logs = cp.logs()["kube-apiserver"]
        if opa is not None:
            logs += f"\n--- opa ---\n{opa.process.tail()}"
        return f"last answer for a GPU pod: {last[0]!r}\n{logs}"

    registered: contextlib.AbstractContextManager[None]
    if engine == "opa":
        assert opa is not None, "the opa engine needs a running OPA"
        registered = _webhook_engine(cp, opa, gate)
    elif engine == ROUTING_ENGINE:
        registered = _routing_engine(cp, gate)
    else:
        registered = _policy_engine(cp, gate)
    with contextlib.suppress(urllib.error.HTTPError):  # the namespace may exist
        cp.create_namespace(gate.namespace)
    with registered:
        wait_for(f"{engine} denying a GPU pod", lambda: denied_by(engine, outcome()), diagnose)
        if engine == ROUTING_ENGINE:
            wait_for(f"{engine} routing a GPU pod", routed, diagnose)
        yield
    wait_for(f"{engine} removed", lambda: outcome() is None, diagnose)
    if engine == ROUTING_ENGINE:  # the mutating policy may outlive the validating one

        def no_longer_routed() -> bool:
            stored = admitted(api_client, namespace, gpu_pod(f"probe-{uuid.uuid4().hex[:6]}", GPU))
            return bool(stored.spec.scheduler_name != gate.config["scheduler_name"])

        wait_for(f"{engine} no longer routing", no_longer_routed, diagnose)


def tolerates(tolerations: Any, taint: Mapping[str, str]) -> bool:
    """Whether one of `tolerations` (as the API returns them) tolerates `taint`, as the
    scheduler matches them: an empty effect matches every effect, an empty key every key,
    Exists every value, Equal (or no operator) the same value.
    Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/core/v1/toleration.go
    """
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and (t.get("value") or "") == taint.get("value", "")
        ):
            return True
    return False


def stored_tolerations(api_client: Any, pod: Any) -> list[dict[str, Any]]:
    """The tolerations of `pod` (a client object or a plain manifest) as plain dicts."""
    plain = api_client.sanitize_for_serialization(pod)
    return list((plain.get("spec") or {}).get("tolerations") or [])
