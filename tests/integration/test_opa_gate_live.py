"""OpaGate's two engines against the real kube-apiserver, the webhook one with the real OPA.

Everything the API server gets is built by the component's own functions: the webhook
(webhook_spec, pointed at a local OPA through clientConfig.url instead of the in-cluster
Service), OPA's arguments and files (opa_run_args, policy_files, gate_data), laid out as the
kubelet mounts a ConfigMap, and the ValidatingAdmissionPolicy and its binding. Nothing is
ever pushed into OPA: it decides from the files it read at start-up, also after a restart.
Pods are created with dryRun=All, so nothing is stored. The control plane is shared by the
session: each engine is active only inside its fixture, which removes it (and waits until
the API server has forgotten it) even when the test fails.
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

from components.gpu_operator_settings import GpuOperatorSettings
from components.opa_gate_manifests import (
    GATE_CONFIG_FILE,
    OPA_PRIORITY_CLASS,
    admission_policy_binding_spec,
    admission_policy_spec,
    gate_data,
    opa_affinity,
    opa_disruption_budget,
    opa_run_args,
    policy_files,
    routing_binding_spec,
    routing_policy_spec,
    webhook_spec,
)
from components.opa_gate_settings import GATE_NAME, WEBHOOK_NAME, load_policies
from tests.gate_samples import Identity, Sample, load_samples
from tests.integration.conftest import built_tool
from tools.harness import LocalControlPlane, ManagedProcess, free_port
from tools.harness.certs import CertificateAuthority, write_private

# The table of sample pods and the gate data it is written for.
SAMPLES = load_samples()
SCHEDULER = SAMPLES.scheduler
# The GPU Operator's namespace in these tests (a namespace removed here stays terminating on
# the session's API server: no namespace controller), and its own pods as its settings
# describe them (namespace and creators).
OPERATOR_NAMESPACE = f"gpu-operator-{uuid.uuid4().hex[:8]}"
OPERATOR_PODS = GpuOperatorSettings.model_validate(
    {"enabled": True, "namespace": OPERATOR_NAMESPACE}
).operator_pods()
GATE_CONFIG = gate_data(
    SCHEDULER, SAMPLES.gpu_resources, SAMPLES.gpu_resource_prefixes, operator_pods=OPERATOR_PODS
)
# The gate's own namespace in these tests: excluded by name, like kube-system.
GATE_NAMESPACE = f"gate-own-{uuid.uuid4().hex[:8]}"
# The label both engines used to skip; anyone who may label a namespace can set it.
BYPASS_LABEL = {"openpolicyagent.org/webhook": "ignore"}
LOOPBACK = "127.0.0.1"
CPU = {"cpu": "1"}
GPU = {"cpu": "1", "nvidia.com/gpu": "1"}
# Until OPA answers, a new gate is in force, or a removed one is forgotten.
TIMEOUT_S = 30.0
POLL_S = 0.25

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
DENIAL["mutating-admission-policy"] = DENIAL["validating-admission-policy"]
ROUTING = "mutating-admission-policy"
# The engines that refuse GPU pods off the scheduler rather than route them.
REJECT_ENGINES = ("opa", "validating-admission-policy")
POOL_TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class OpaServer:
    """A running `opa run` with the gate's policies, data and authorization."""

    url: str
    ca_pem: bytes
    process: ManagedProcess

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


@dataclass(frozen=True)
class Namespaces:
    gated: str
    labelled: str
    """Carries BYPASS_LABEL."""
    own: str
    """The gate's own namespace."""
    operator: str = OPERATOR_NAMESPACE
    """The GPU Operator's namespace."""


def _http(request: urllib.request.Request, context: ssl.SSLContext | None = None) -> int:
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


def _wait_for(what: str, check: Callable[[], bool], diagnose: Callable[[], str]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen within {TIMEOUT_S:.0f} s\n{diagnose()}", pytrace=False)
        time.sleep(POLL_S)


# ------------------------------------------------------------------------- OPA


def _mount_like_configmap(directory: Path, files: Mapping[str, str]) -> None:
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


def _ready(server: OpaServer) -> bool:
    ready = urllib.request.Request(f"{server.url}/health/ready")
    return server.process.running() and _http(ready, server.context()) == 200


@pytest.fixture(scope="module")
def opa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaServer]:
    """OPA started as the Deployment starts it, from the same mounted files; no pushes."""
    opa = built_tool("opa")
    root = tmp_path_factory.mktemp("opa-gate")
    certs = root / "certs"
    certs.mkdir()
    ca = CertificateAuthority("gpu-cluster opa-gate test CA")
    serving = ca.issue("opa", ip_addresses=[LOOPBACK], server=True)
    (certs / "tls.crt").write_bytes(serving.cert_pem)
    write_private(certs / "tls.key", serving.key_pem)
    _mount_like_configmap(root / "policies", policy_files(load_policies()))
    _mount_like_configmap(root / "config", {GATE_CONFIG_FILE: json.dumps(GATE_CONFIG)})

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
        _wait_for("OPA readiness (/health/ready)", lambda: _ready(server), process.tail)
        yield server
    finally:
        process.stop()


def test_opa_gate_live_opa_refuses_policy_and_data_api(opa_server: OpaServer) -> None:
    # Anonymous callers (the API server, anyone reaching the Service) get decisions and
    # /health only: nobody can replace the policy or read or change its data over HTTP.
    context = opa_server.context()
    base = opa_server.url
    upload = urllib.request.Request(f"{base}/v1/policies/evil", data=b"package evil", method="PUT")
    delete = urllib.request.Request(f"{base}/v1/policies/{GATE_NAME}", method="DELETE")
    read = urllib.request.Request(f"{base}/v1/data/gpu_cluster/config")
    write = urllib.request.Request(f"{base}/v1/data/gpu_cluster/config", data=b"{}", method="PUT")
    statuses = [_http(r, context) for r in (upload, delete, read, write)]
    assert statuses == [401, 401, 401, 401]


# ---------------------------------------------------------------- API server


def _pod(
    name: str,
    limits: Mapping[str, str],
    *,
    scheduler: str | None = None,
    init_limits: Mapping[str, str] | None = None,
) -> client.V1Pod:
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


def _create(api_client: Any, namespace: str, pod: client.V1Pod) -> str | None:
    """Dry-run create: None when admitted, else the API server's Status.message."""
    try:
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        if exc.status not in (400, 403, 422, 500):
            raise
        message: str = json.loads(exc.body or "{}").get("message", str(exc))
        return message
    return None


def _denied_by(engine: str, outcome: str | None) -> bool:
    return outcome is not None and DENIAL[engine].match(outcome) is not None


SERVICE_ACCOUNT_USER = re.compile(r"^system:serviceaccount:(?P<namespace>[^:]+):(?P<name>[^:]+)$")


def _sample_creators() -> list[str]:
    """The ServiceAccounts (user names) samples are created as, other than kube-system's."""
    creators = {s.creator(OPERATOR_NAMESPACE) for s in SAMPLES.samples}
    return sorted(
        {
            c.user
            for c in creators
            if c is not None
            and (m := SERVICE_ACCOUNT_USER.match(c.user)) is not None
            and m["namespace"] != "kube-system"
        }
    )


def _let_create_pods(cp: LocalControlPlane, namespace: str, user: str) -> None:
    """A Role to create pods in `namespace`, bound to ServiceAccount `user` (the aggregated
    `edit` role stays empty: there is no kube-controller-manager to aggregate it)."""
    match = SERVICE_ACCOUNT_USER.match(user)
    assert match is not None
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    name = f"sample-creator-{match['name']}"
    role = {
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
    }
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "namespace": match["namespace"], "name": match["name"]}
        ],
    }
    cp.request("POST", f"{rbac}/roles", role)
    cp.request("POST", f"{rbac}/rolebindings", binding)


@pytest.fixture(scope="module")
def namespaces(control_plane: LocalControlPlane) -> Iterator[Namespaces]:
    suffix = uuid.uuid4().hex[:8]
    made = Namespaces(
        gated=f"gate-team-{suffix}", labelled=f"gate-labelled-{suffix}", own=GATE_NAMESPACE
    )
    for name in (made.gated, made.labelled, made.own, made.operator):
        control_plane.create_namespace(name)
    control_plane.request(
        "PATCH", f"/api/v1/namespaces/{made.labelled}", {"metadata": {"labels": BYPASS_LABEL}}
    )
    # The samples' creators may create pods where they are created: the operator's validator
    # (kube-apiserver's bootstrap roles already let the DaemonSet controller and nodes do so).
    for name in (made.gated, made.operator):
        for creator in _sample_creators():
            _let_create_pods(control_plane, name, creator)
    # kube-system exists, but without kube-controller-manager nothing gives it the
    # `default` ServiceAccount pods are admitted with; a real cluster has it.
    with contextlib.suppress(urllib.error.HTTPError):
        control_plane.request(
            "POST",
            "/api/v1/namespaces/kube-system/serviceaccounts",
            {"metadata": {"name": "default"}},
        )
    try:
        yield made
    finally:
        for name in (made.gated, made.labelled, made.own, made.operator):
            with contextlib.suppress(urllib.error.HTTPError):
                control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


@contextlib.contextmanager
def _webhook_engine(cp: LocalControlPlane, opa: OpaServer) -> Iterator[None]:
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    hook = webhook_spec(
        config=GATE_CONFIG,
        gate_namespace=GATE_NAMESPACE,
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
def _routing_policy(cp: LocalControlPlane) -> Iterator[None]:
    api = "/apis/admissionregistration.k8s.io/v1"
    policy = {
        "metadata": {"name": GATE_NAME},
        "spec": routing_policy_spec(GATE_CONFIG, POOL_TOLERATION, gate_namespace=GATE_NAMESPACE),
    }
    binding = {
        "metadata": {"name": GATE_NAME},
        "spec": routing_binding_spec(gate_namespace=GATE_NAMESPACE),
    }
    cp.request("POST", f"{api}/mutatingadmissionpolicies", policy)
    try:
        cp.request("POST", f"{api}/mutatingadmissionpolicybindings", binding)
        try:
            yield
        finally:
            cp.request("DELETE", f"{api}/mutatingadmissionpolicybindings/{GATE_NAME}")
    finally:
        cp.request("DELETE", f"{api}/mutatingadmissionpolicies/{GATE_NAME}")


@contextlib.contextmanager
def _routing_engine(cp: LocalControlPlane) -> Iterator[None]:
    with _policy_engine(cp), _routing_policy(cp):
        yield


@contextlib.contextmanager
def _policy_engine(cp: LocalControlPlane) -> Iterator[None]:
    api = "/apis/admissionregistration.k8s.io/v1"
    policy = {
        "metadata": {"name": GATE_NAME},
        "spec": admission_policy_spec(GATE_CONFIG, gate_namespace=GATE_NAMESPACE),
    }
    binding = {
        "metadata": {"name": GATE_NAME},
        "spec": admission_policy_binding_spec(gate_namespace=GATE_NAMESPACE),
    }
    cp.request("POST", f"{api}/validatingadmissionpolicies", policy)
    try:
        cp.request("POST", f"{api}/validatingadmissionpolicybindings", binding)
        try:
            yield
        finally:
            cp.request("DELETE", f"{api}/validatingadmissionpolicybindings/{GATE_NAME}")
    finally:
        cp.request("DELETE", f"{api}/validatingadmissionpolicies/{GATE_NAME}")


@contextlib.contextmanager
def _engine_active(
    engine: str, cp: LocalControlPlane, api_client: Any, namespace: str, opa: OpaServer | None
) -> Iterator[None]:
    """The engine registered and in force; afterwards removed and no longer enforced.

    A GPU pod on a scheduler of its own is refused by every engine; the routing engine is
    in force once it also routes a GPU pod that names none.
    """
    probe = _pod(f"probe-{uuid.uuid4().hex[:6]}", GPU, scheduler="team-scheduler")
    unrouted = _pod(f"probe-{uuid.uuid4().hex[:6]}", GPU)
    last: list[str | None] = [None]

    def outcome() -> str | None:
        last[0] = _create(api_client, namespace, probe)
        return last[0]

    def routed() -> bool:
        last[0] = _create(api_client, namespace, unrouted)
        return last[0] is None

    def diagnose() -> str:
        logs = cp.logs()["kube-apiserver"]
        if opa is not None:
            logs += f"\n--- opa ---\n{opa.process.tail()}"
        return f"last answer for a GPU pod: {last[0]!r}\n{logs}"

    registered = (
        _webhook_engine(cp, opa)
        if opa is not None
        else _routing_engine(cp)
        if engine == ROUTING
        else _policy_engine(cp)
    )
    with registered:
        _wait_for(f"{engine} denying a GPU pod", lambda: _denied_by(engine, outcome()), diagnose)
        if engine == ROUTING:
            _wait_for(f"{engine} routing a GPU pod", routed, diagnose)
        yield
    _wait_for(f"{engine} removed", lambda: outcome() is None, diagnose)


@pytest.fixture(params=REJECT_ENGINES)
def engine(
    request: pytest.FixtureRequest,
    control_plane: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
) -> Iterator[str]:
    """Each engine in turn, in force on the session's API server for one test."""
    name: str = request.param
    opa = request.getfixturevalue("opa_server") if name == "opa" else None
    with _engine_active(name, control_plane, api_client, namespaces.gated, opa):
        yield name


def test_opa_gate_live_denies_gpu_pod_without_scheduler_name(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = _create(api_client, namespaces.gated, _pod("train-0", GPU))

    assert outcome is not None, f"{engine} admitted a GPU pod on the default scheduler"
    denial = DENIAL[engine].match(outcome)
    assert denial, f"not denied by {engine}: {outcome}"
    # The API server defaults schedulerName before validating admission runs.
    assert denial["message"] == (
        f'pod "{namespaces.gated}/train-0" requests nvidia.com/gpu but spec.schedulerName'
        f' is "default-scheduler"; GPU pods must set spec.schedulerName: {SCHEDULER}'
    )


def test_opa_gate_live_admits_gpu_pod_on_binpack_scheduler(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    pod = _pod("train-1", GPU, scheduler=SCHEDULER)
    assert _create(api_client, namespaces.gated, pod) is None


def test_opa_gate_live_admits_cpu_only_pod(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    pod = _pod("web-0", CPU)
    assert _create(api_client, namespaces.gated, pod) is None


def test_opa_gate_live_label_does_not_bypass_the_gate(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = _create(api_client, namespaces.labelled, _pod("train-2", GPU))
    assert _denied_by(engine, outcome), f"{engine} let a labelled namespace through: {outcome}"


@pytest.mark.parametrize("excluded", ["own", "kube-system"])
def test_opa_gate_live_admits_gpu_pod_in_excluded_namespace(
    engine: str, api_client: Any, namespaces: Namespaces, excluded: str
) -> None:
    namespace = namespaces.own if excluded == "own" else "kube-system"
    assert _create(api_client, namespace, _pod("train-3", GPU)) is None


# ------------------------------------------------------------------ routing


@pytest.fixture
def routing(
    control_plane: LocalControlPlane, api_client: Any, namespaces: Namespaces
) -> Iterator[None]:
    """The routing engine (MutatingAdmissionPolicy and ValidatingAdmissionPolicy) in force."""
    with _engine_active(ROUTING, control_plane, api_client, namespaces.gated, None):
        yield


def _admitted(api_client: Any, namespace: str, pod: client.V1Pod) -> Any:
    """The pod as the API server would store it (dry run)."""
    created: Any = client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod, dry_run="All")
    return created


def _pool_tolerations(pod: Any) -> list[tuple[Any, ...]]:
    return [
        (t.key, t.operator, t.value, t.effect)
        for t in pod.spec.tolerations or []
        if t.key == POOL_TOLERATION["key"]
    ]


def test_opa_gate_live_routing_sets_scheduler_and_pool_toleration(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = _admitted(api_client, namespaces.gated, _pod("routed-0", GPU))
    assert pod.spec.scheduler_name == SCHEDULER
    assert _pool_tolerations(pod) == [("nvidia.com/gpu", "Equal", "present", "NoSchedule")]


def test_opa_gate_live_routing_keeps_a_toleration_that_covers_the_taint(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    own: Any = _pod("routed-1", GPU)
    own.spec.tolerations = [client.V1Toleration(key="nvidia.com/gpu", operator="Exists")]
    pod = _admitted(api_client, namespaces.gated, own)
    assert pod.spec.scheduler_name == SCHEDULER
    assert _pool_tolerations(pod) == [("nvidia.com/gpu", "Exists", None, None)]


def test_opa_gate_live_routing_leaves_cpu_pods_alone(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = _admitted(api_client, namespaces.gated, _pod("web-routed", CPU))
    assert pod.spec.scheduler_name == "default-scheduler"
    assert _pool_tolerations(pod) == []


def test_opa_gate_live_routing_refuses_another_scheduler(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = _create(api_client, namespaces.gated, _pod("own-0", GPU, scheduler="team-sched"))
    denial = DENIAL[ROUTING].match(outcome or "")
    assert denial, f"not refused: {outcome}"
    assert denial["message"] == (
        f'pod "{namespaces.gated}/own-0" requests nvidia.com/gpu but spec.schedulerName'
        f' is "team-sched"; GPU pods must set spec.schedulerName: {SCHEDULER}'
    )


def test_opa_gate_live_routing_refuses_a_pod_created_bound_to_a_node(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    bound: Any = _pod("bound-0", GPU)
    bound.spec.node_name = "gpu-node-1"
    outcome = _create(api_client, namespaces.gated, bound)
    assert _denied_by(ROUTING, outcome), f"not refused: {outcome}"


OPA_SELECTOR = {"app.kubernetes.io/name": "opa"}


def test_opa_gate_live_opa_scheduling_fields_are_accepted_in_the_gate_namespace(
    control_plane: LocalControlPlane, namespaces: Namespaces
) -> None:
    # The Priority admission plugin resolves the class; it is not reserved to kube-system.
    pod = {
        "metadata": {"name": "opa-0", "labels": OPA_SELECTOR},
        "spec": {
            "priorityClassName": OPA_PRIORITY_CLASS,
            "affinity": opa_affinity(OPA_SELECTOR),
            "automountServiceAccountToken": False,
            "containers": [{"name": "opa", "image": "registry.invalid/opa:1"}],
        },
    }
    created = control_plane.request(
        "POST", f"/api/v1/namespaces/{namespaces.own}/pods?dryRun=All", pod
    )
    assert created["spec"]["priorityClassName"] == OPA_PRIORITY_CLASS
    assert created["spec"]["priority"] == 2000000000


def test_opa_gate_live_disruption_budget_is_accepted(
    control_plane: LocalControlPlane, namespaces: Namespaces
) -> None:
    spec = opa_disruption_budget(2, OPA_SELECTOR)
    assert spec is not None
    created = control_plane.request(
        "POST",
        f"/apis/policy/v1/namespaces/{namespaces.own}/poddisruptionbudgets?dryRun=All",
        {"metadata": {"name": "opa"}, "spec": spec},
    )
    assert created["spec"] == spec


# OPA answers this fast once its files are read; the kubelet probes every 5 s.
RESTART_READY_S = 10.0


def test_opa_gate_live_decides_again_after_opa_restarts(
    control_plane: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    opa_server: OpaServer,
) -> None:
    ns, process = namespaces.gated, opa_server.process
    with _engine_active("opa", control_plane, api_client, ns, opa_server):
        process.stop()
        try:
            # While OPA is down, failurePolicy Fail holds GPU pods back, and only them:
            # the webhook's match condition never sends other pods to OPA.
            outage = _create(api_client, ns, _pod("train-outage", GPU, scheduler=SCHEDULER))
            cpu_in_outage = _create(api_client, ns, _pod("web-outage", CPU))
            # Nor the GPU Operator's own pods, though its device plugin sets
            # NVIDIA_VISIBLE_DEVICES: they are never sent.
            operand_in_outage = _create_sample(
                control_plane, api_client, namespaces, "operator-daemonset-operand"
            )
            started = time.monotonic()
            process.start()
            _wait_for("OPA readiness after a restart", lambda: _ready(opa_server), process.tail)
            ready_s = time.monotonic() - started
            # Nothing was pushed: the restarted OPA judges from the files it read.
            denied = _create(api_client, ns, _pod("train-restart-0", GPU))
            admitted = _create(api_client, ns, _pod("train-restart-1", GPU, scheduler=SCHEDULER))
        finally:
            if not process.running():
                process.start()
    print(f"OPA ready {ready_s:.2f} s after its restart")

    assert outage is not None and "failed calling webhook" in outage, outage
    assert cpu_in_outage is None
    assert operand_in_outage is None, operand_in_outage
    assert ready_s < RESTART_READY_S
    denial = DENIAL["opa"].match(denied or "")
    assert denial, f"not denied by the restarted OPA: {denied}"
    assert denial["message"].startswith(f'pod "{ns}/train-restart-0" requests nvidia.com/gpu')
    assert admitted is None


@contextlib.contextmanager
def _client_as(cp: LocalControlPlane, identity: Identity | None, admin: Any) -> Iterator[Any]:
    """An API client acting as `identity` (impersonated by the admin), or the admin's."""
    if identity is None:
        yield admin
        return
    impersonating = cp.api_client()
    impersonating.set_default_header("Impersonate-User", identity.user)
    # One header per group would be right; the client keeps one value per name, and every
    # identity in the table needs only its first group to be authorized.
    if identity.groups:
        impersonating.set_default_header("Impersonate-Group", identity.groups[0])
    try:
        yield impersonating
    finally:
        impersonating.close()


def _sample_namespace(sample: Sample, namespaces: Namespaces) -> str:
    return namespaces.operator if sample.namespace == "operator" else namespaces.gated


def _create_sample(
    cp: LocalControlPlane, admin: Any, namespaces: Namespaces, name: str
) -> str | None:
    """Dry-run create of the table's sample `name` as its creator: None when admitted, else
    the API server's Status.message."""
    (sample,) = [s for s in SAMPLES.samples if s.name == name]
    pod: Any = sample.pod(name)  # the client sends a plain manifest as it is
    with _client_as(cp, sample.creator(namespaces.operator), admin) as creator:
        return _create(creator, _sample_namespace(sample, namespaces), pod)


def _judge_table(
    engine: str,
    cp: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    opa: OpaServer | None,
) -> list[str]:
    """With `engine` in force, each sample's disagreement with the table, if any."""
    wrong: list[str] = []
    with _engine_active(engine, cp, api_client, namespaces.gated, opa):
        for i, sample in enumerate(SAMPLES.samples):
            name = f"sample-{i}"
            namespace = _sample_namespace(sample, namespaces)
            pod: Any = sample.pod(name)
            written = pod["spec"].get("schedulerName", "default-scheduler")
            expected = sample.verdict(engine)
            try:
                with _client_as(cp, sample.creator(namespaces.operator), api_client) as creator:
                    core = client.CoreV1Api(creator)
                    stored: Any = core.create_namespaced_pod(namespace, pod, dry_run="All")
            except ApiException as exc:
                message = json.loads(exc.body or "{}").get("message", str(exc))
                denial = DENIAL[engine].match(message)
                wanted = (sample.message or "").replace("{pod}", f"{namespace}/{name}")
                if denial is None:
                    wrong.append(f"{engine} {sample.name}: not the gate's refusal: {message}")
                elif expected != "refused" or wanted not in denial["message"]:
                    wrong.append(f"{engine} {sample.name}: refused ({denial['message']})")
                continue
            scheduler = stored.spec.scheduler_name
            outcome = "routed" if scheduler == SCHEDULER and written != SCHEDULER else "allowed"
            if outcome == "allowed" and scheduler != written:
                outcome = f"admitted with schedulerName {scheduler}"
            if outcome != expected:
                wrong.append(f"{engine} {sample.name}: {outcome}, table says {expected}")
    return wrong


def test_opa_gate_live_engines_reach_the_sample_tables_verdicts(
    control_plane: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    opa_server: OpaServer,
) -> None:
    """tests/fixtures/gate_samples.yaml: every engine, every sample, one verdict each."""
    ns = namespaces
    wrong = [
        *_judge_table("opa", control_plane, api_client, ns, opa_server),
        *_judge_table("validating-admission-policy", control_plane, api_client, ns, None),
        *_judge_table(ROUTING, control_plane, api_client, ns, None),
    ]
    assert not wrong, "\n".join(wrong)
