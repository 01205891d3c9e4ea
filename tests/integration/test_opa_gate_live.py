"""OpaGate's engines against the real kube-apiserver, the webhook one with the real OPA.

The engines are registered from the component's own builders (tests/integration/gate_live.py):
the webhook pointed at a local OPA started as the Deployment starts it, the
ValidatingAdmissionPolicy, the MutatingAdmissionPolicy. Pods are created with dryRun=All, so
nothing is stored, except the pods of the sample table's `debug` and `tolerate` rows, created for real to get
an ephemeral container and deleted again. The control plane is shared by the session: each
engine is active only inside its fixture, which removes it (and waits until the API server has
forgotten it) even when the test fails.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.gpu_operator.settings import GpuOperatorSettings
from components.handoffs import OperatorPods
from components.opa_gate.manifests import (
    OPA_PRIORITY_CLASS,
    gate_data,
    opa_affinity,
    opa_disruption_budget,
)
from components.opa_gate.settings import GATE_NAME, OpaGateSettings
from components.tainted_gpu_pool.settings import Taint
from tests.integration.gate_live import (
    CPU,
    DENIAL,
    GPU,
    Gate,
    OpaServer,
    admitted,
    create,
    denied_by,
    engine_active,
    gpu_pod,
    http_status,
    opa_ready,
    opa_serving,
    refusal,
    stored_tolerations,
    tolerates,
    wait_for,
)
from tests.opa_gate.gate_samples import Identity, Namespace, Sample, load_samples
from tools.harness import LocalControlPlane

# The table of sample pods and the gate data it is written for.
SAMPLES = load_samples()
SCHEDULER = SAMPLES.scheduler
# The GPU pool's taint, and the toleration TaintedGpuPool derives from it for the gate.
POOL_TAINT = SAMPLES.pool_taint
POOL_TOLERATION = Taint.model_validate(POOL_TAINT).toleration()
# The GPU Operator's own pods, as __main__.py hands them to the gate: the operator the stack
# installs (gpuOperator), or one installed outside it (admission.externalGpuOperatorNamespace).
# Each has a namespace of its own (a namespace removed here stays terminating on the session's
# API server: no namespace controller).
INSTALLED, EXTERNAL = "installed", "external"
OPERATORS: dict[str, OperatorPods | None] = {
    INSTALLED: GpuOperatorSettings.model_validate(
        {"enabled": True, "namespace": f"gpu-operator-{uuid.uuid4().hex[:8]}"}
    ).operator_pods(),
    EXTERNAL: GpuOperatorSettings().operator_pods(
        OpaGateSettings.model_validate(
            {"externalGpuOperatorNamespace": f"nvidia-gpu-operator-{uuid.uuid4().hex[:8]}"}
        ).external_gpu_operator_namespace
    ),
}


def _operator_namespace(source: str) -> str:
    operator = OPERATORS[source]
    assert operator is not None
    return operator.namespace


# The gate's own namespace in these tests: excluded by name, like kube-system. The gate set up
# for an operator outside the stack has one of its own.
GATE_NAMESPACE = f"gate-own-{uuid.uuid4().hex[:8]}"
# The namespace whose pods may name the stack's PriorityClasses without a GPU (the table's
# `serving`, priorityClasses.allowedNamespaces).
SERVING_NAMESPACE = f"gate-serving-{uuid.uuid4().hex[:8]}"
# The namespace the samples are created in (tenants' pods), and the one BYPASS_LABEL marks.
GATED_NAMESPACE = f"gate-team-{uuid.uuid4().hex[:8]}"


def _names(operator: OperatorPods | None) -> dict[Namespace, str]:
    """The test's name for each namespace kind of the sample table."""
    return {
        "gated": GATED_NAMESPACE,
        "operator": operator.namespace if operator is not None else "",
        "serving": SERVING_NAMESPACE,
    }


GATES = {
    source: Gate(
        config=gate_data(
            SCHEDULER,
            SAMPLES.gpu_resources,
            SAMPLES.gpu_resource_prefixes,
            operator_pods=operator,
            pool_toleration=POOL_TOLERATION,
            gang_pods=SAMPLES.gang_pods,
            gang_namespaces=SAMPLES.gang_namespace_names(_names(operator)),
            **SAMPLES.pool_fence(_names(operator)),
            priority_classes=SAMPLES.priority_classes,
            priority_class_namespaces=[SERVING_NAMESPACE],
        ),
        namespace=GATE_NAMESPACE if source == INSTALLED else f"{GATE_NAMESPACE}-{source}",
    )
    for source, operator in OPERATORS.items()
}
GATE = GATES[INSTALLED]
# The label both engines used to skip; anyone who may label a namespace can set it.
BYPASS_LABEL = {"openpolicyagent.org/webhook": "ignore"}
ROUTING = "mutating-admission-policy"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
# The engines that refuse GPU pods off the scheduler rather than route them.
REJECT_ENGINES = ("opa", "validating-admission-policy")
ENGINES = (*REJECT_ENGINES, ROUTING)


@dataclass(frozen=True)
class Namespaces:
    gated: str
    labelled: str
    """Carries BYPASS_LABEL."""
    own: str
    """The gate's own namespace."""
    serving: str = SERVING_NAMESPACE
    """Its pods may name the stack's PriorityClasses without asking for a GPU."""
    operators: dict[str, str] = field(
        default_factory=lambda: {s: _operator_namespace(s) for s in OPERATORS}
    )
    """The GPU Operator's namespace, by where it comes from."""

    def all(self) -> list[str]:
        return [self.gated, self.labelled, self.own, self.serving, *self.operators.values()]


@pytest.fixture(scope="module")
def opa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaServer]:
    """OPA with the installed operator's gate data, as the Deployment starts it; no pushes."""
    with opa_serving(tmp_path_factory.mktemp("opa-gate"), GATE.config) as server:
        yield server


def test_opa_gate_live_opa_refuses_policy_and_data_api(opa_server: OpaServer) -> None:
    # Anonymous callers (the API server, anyone reaching the Service) get decisions and
    # /health only: nobody can replace the policy or read or change its data over HTTP.
    context = opa_server.context()
    base = opa_server.url
    upload = urllib.request.Request(f"{base}/v1/policies/evil", data=b"package evil", method="PUT")
    delete = urllib.request.Request(f"{base}/v1/policies/{GATE_NAME}", method="DELETE")
    read = urllib.request.Request(f"{base}/v1/data/gpu_cluster/config")
    write = urllib.request.Request(f"{base}/v1/data/gpu_cluster/config", data=b"{}", method="PUT")
    statuses = [http_status(r, context) for r in (upload, delete, read, write)]
    assert statuses == [401, 401, 401, 401]


# ---------------------------------------------------------------- API server


SERVICE_ACCOUNT_USER = re.compile(r"^system:serviceaccount:(?P<namespace>[^:]+):(?P<name>[^:]+)$")


def _sample_creators(operator: str, namespace: str) -> list[str]:
    """The ServiceAccounts (user names) samples are created as in `namespace`, when the
    operator's namespace is `operator`, other than kube-system's."""
    creators = {s.creator(operator, namespace) for s in SAMPLES.samples}
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
    name = f"sample-creator-{match['namespace']}-{match['name']}"
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
    made = Namespaces(gated=GATED_NAMESPACE, labelled=f"gate-labelled-{suffix}", own=GATE_NAMESPACE)
    for name in made.all():
        control_plane.create_namespace(name)
    control_plane.request(
        "PATCH", f"/api/v1/namespaces/{made.labelled}", {"metadata": {"labels": BYPASS_LABEL}}
    )
    # The samples' creators may create pods where they are created: the operator's validator,
    # a tenant's own account (kube-apiserver's bootstrap roles already let the DaemonSet
    # controller and nodes do so).
    for operator in made.operators.values():
        for name in (made.gated, operator):
            for creator in _sample_creators(operator, name):
                with contextlib.suppress(urllib.error.HTTPError):  # granted for the other
                    _let_create_pods(control_plane, name, creator)
    # kube-system exists, but without kube-controller-manager nothing gives it the
    # `default` ServiceAccount pods are admitted with; a real cluster has it.
    with contextlib.suppress(urllib.error.HTTPError):
        control_plane.request(
            "POST",
            "/api/v1/namespaces/kube-system/serviceaccounts",
            {"metadata": {"name": "default"}},
        )
    # The PriorityClasses the samples name: the Priority admission plugin refuses a pod whose
    # class does not exist, before the gate judges it.
    classes = SAMPLES.priority_class_objects()
    try:
        for priority_class in classes:
            control_plane.request("POST", PRIORITY_CLASSES, priority_class)
        yield made
    finally:
        for name in made.all():
            with contextlib.suppress(urllib.error.HTTPError):
                control_plane.request("DELETE", f"/api/v1/namespaces/{name}")
        for priority_class in classes:
            with contextlib.suppress(urllib.error.HTTPError):
                control_plane.request(
                    "DELETE", f"{PRIORITY_CLASSES}/{priority_class['metadata']['name']}"
                )


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
    with engine_active(name, control_plane, api_client, namespaces.gated, GATE, opa):
        yield name


def test_opa_gate_live_denies_gpu_pod_without_scheduler_name(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = create(api_client, namespaces.gated, gpu_pod("train-0", GPU))

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
    pod = gpu_pod("train-1", GPU, scheduler=SCHEDULER)
    assert create(api_client, namespaces.gated, pod) is None


def test_opa_gate_live_admits_cpu_only_pod(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    pod = gpu_pod("web-0", CPU)
    assert create(api_client, namespaces.gated, pod) is None


# What someone who may write ConfigMaps in the gate's namespace would put there to open the
# gate (no parameter object: the GPU pods' verdicts must not change) or invert it (GPU pods to
# the default scheduler, everyone exempt as the GPU Operator's pods).
TAMPERED = {
    "scheduler_name": "default-scheduler",
    "gpu_resources": "example.com/none",
    "operator_pods.namespace": "*",
    "operator_pods.creators": "kubernetes-admin,system:admin",
    "operator_pods.daemonset_controllers": "system:kube-controller-manager",
}
# The names the gate's parameters had, and OPA's data (read from its files, never the API).
PARAMETER_NAMES = ("gpu-gate-params", "gpu-gate-config")


@pytest.mark.parametrize("engine_name", ["validating-admission-policy", ROUTING])
def test_opa_gate_live_no_configmap_in_the_gates_namespace_opens_or_inverts_it(
    engine_name: str, control_plane: LocalControlPlane, api_client: Any, namespaces: Namespaces
) -> None:
    """The native engines hold no parameter object: ConfigMaps created, edited or deleted in
    the gate's namespace change no verdict (GPU pods off the scheduler refused, unset ones
    routed or refused, CPU pods admitted)."""
    configmaps = f"/api/v1/namespaces/{GATE.namespace}/configmaps"

    def verdicts() -> dict[str, str]:
        seen = {}
        for label, pod in (
            (
                "gpu-default",
                gpu_pod(f"t-{uuid.uuid4().hex[:6]}", GPU, scheduler="default-scheduler"),
            ),
            ("gpu-unset", gpu_pod(f"t-{uuid.uuid4().hex[:6]}", GPU)),
            ("cpu", gpu_pod(f"t-{uuid.uuid4().hex[:6]}", CPU)),
        ):
            try:
                stored = admitted(api_client, namespaces.gated, pod)
                seen[label] = f"admitted on {stored.spec.scheduler_name}"
            except ApiException as exc:
                seen[label] = "refused" if denied_by(engine_name, refusal(exc)) else str(exc)
        return seen

    # The API server writes default-scheduler into a pod that names none: the routing engine
    # routes both.
    gpu = f"admitted on {SCHEDULER}" if engine_name == ROUTING else "refused"
    expected = {"gpu-default": gpu, "gpu-unset": gpu, "cpu": "admitted on default-scheduler"}
    with engine_active(engine_name, control_plane, api_client, namespaces.gated, GATE):
        assert verdicts() == expected
        try:
            for name in PARAMETER_NAMES:  # created, or replaced where one exists
                body = {"metadata": {"name": name}, "data": TAMPERED}
                try:
                    control_plane.request("POST", configmaps, body)
                except urllib.error.HTTPError as exc:
                    if exc.code != 409:
                        raise
                    control_plane.request("PUT", f"{configmaps}/{name}", body)
            time.sleep(2)  # longer than the API server's informers take to see them
            assert verdicts() == expected, "edited parameters changed the gate"
        finally:
            for name in PARAMETER_NAMES:
                with contextlib.suppress(urllib.error.HTTPError):
                    control_plane.request("DELETE", f"{configmaps}/{name}")
        time.sleep(2)
        assert verdicts() == expected, "deleted parameters changed the gate"


def test_opa_gate_live_label_does_not_bypass_the_gate(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = create(api_client, namespaces.labelled, gpu_pod("train-2", GPU))
    assert denied_by(engine, outcome), f"{engine} let a labelled namespace through: {outcome}"


@pytest.mark.parametrize("excluded", ["own", "kube-system"])
def test_opa_gate_live_admits_gpu_pod_in_excluded_namespace(
    engine: str, api_client: Any, namespaces: Namespaces, excluded: str
) -> None:
    namespace = namespaces.own if excluded == "own" else "kube-system"
    assert create(api_client, namespace, gpu_pod("train-3", GPU)) is None


def _pool_pod(name: str) -> Any:
    """A CPU pod that tolerates the GPU pool's taint: in the pool's namespaces (`serving`) a
    pool pod, kept on the scheduler; refused elsewhere."""
    pod: Any = gpu_pod(name, CPU)
    pod.spec.tolerations = [client.V1Toleration(key=POOL_TAINT["key"], operator="Exists")]
    return pod


def test_opa_gate_live_denies_pool_pod_without_scheduler_name(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = create(api_client, namespaces.serving, _pool_pod("prep-0"))
    denial = DENIAL[engine].match(outcome or "")
    assert denial, f"not denied by {engine}: {outcome}"
    assert denial["message"] == (
        f'pod "{namespaces.serving}/prep-0" tolerates the GPU pool\'s taint {POOL_TAINT["key"]}'
        ' but spec.schedulerName is "default-scheduler"; pods that tolerate it must set'
        f" spec.schedulerName: {SCHEDULER} (one scheduler places every pod on the pool's nodes)"
    )


def test_opa_gate_live_denies_pool_pod_outside_the_pools_namespaces(
    engine: str, api_client: Any, namespaces: Namespaces
) -> None:
    outcome = create(api_client, namespaces.gated, _pool_pod("prep-2"))
    denial = DENIAL[engine].match(outcome or "")
    assert denial, f"not denied by {engine}: {outcome}"
    assert denial["message"] == (
        f'pod "{namespaces.gated}/prep-2" asks for no GPU but tolerates the GPU pool\'s taint '
        f"{POOL_TAINT['key']}; the pool's nodes take GPU pods, and pods in namespaces: "
        f"{namespaces.serving}, and pods of DaemonSets: {namespaces.gated}/node-agent"
    )


@pytest.mark.parametrize("excluded", ["own", "kube-system"])
def test_opa_gate_live_admits_pool_pod_in_excluded_namespace(
    engine: str, api_client: Any, namespaces: Namespaces, excluded: str
) -> None:
    namespace = namespaces.own if excluded == "own" else "kube-system"
    assert create(api_client, namespace, _pool_pod("prep-1")) is None


# ------------------------------------------------------------------ routing


@pytest.fixture
def routing(
    control_plane: LocalControlPlane, api_client: Any, namespaces: Namespaces
) -> Iterator[None]:
    """The routing engine (MutatingAdmissionPolicy and ValidatingAdmissionPolicy) in force."""
    with engine_active(ROUTING, control_plane, api_client, namespaces.gated, GATE):
        yield


def _pool_tolerations(pod: Any) -> list[tuple[Any, ...]]:
    return [
        (t.key, t.operator, t.value, t.effect)
        for t in pod.spec.tolerations or []
        if t.key == POOL_TOLERATION["key"]
    ]


def test_opa_gate_live_routing_sets_scheduler_and_pool_toleration(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = admitted(api_client, namespaces.gated, gpu_pod("routed-0", GPU))
    assert pod.spec.scheduler_name == SCHEDULER
    assert _pool_tolerations(pod) == [("nvidia.com/gpu", "Equal", "present", "NoSchedule")]


def test_opa_gate_live_routing_keeps_a_toleration_that_covers_the_taint(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    own: Any = gpu_pod("routed-1", GPU)
    own.spec.tolerations = [client.V1Toleration(key="nvidia.com/gpu", operator="Exists")]
    pod = admitted(api_client, namespaces.gated, own)
    assert pod.spec.scheduler_name == SCHEDULER
    assert _pool_tolerations(pod) == [("nvidia.com/gpu", "Exists", None, None)]


def test_opa_gate_live_routing_leaves_cpu_pods_alone(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = admitted(api_client, namespaces.gated, gpu_pod("web-routed", CPU))
    assert pod.spec.scheduler_name == "default-scheduler"
    assert _pool_tolerations(pod) == []


def test_opa_gate_live_routing_routes_a_pool_pod(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = admitted(api_client, namespaces.serving, _pool_pod("prep-routed"))
    assert pod.spec.scheduler_name == SCHEDULER
    # Its own toleration covers the taint: the gate adds none.
    assert _pool_tolerations(pod) == [("nvidia.com/gpu", "Exists", None, None)]


@pytest.mark.parametrize("excluded", ["own", "kube-system"])
def test_opa_gate_live_routing_leaves_pool_pods_in_excluded_namespaces_alone(
    routing: None, api_client: Any, namespaces: Namespaces, excluded: str
) -> None:
    namespace = namespaces.own if excluded == "own" else "kube-system"
    pod = admitted(api_client, namespace, _pool_pod("prep-excluded"))
    assert pod.spec.scheduler_name == "default-scheduler"


def test_opa_gate_live_routing_refuses_another_scheduler(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    pod = gpu_pod("own-0", GPU, scheduler="team-sched")
    outcome = create(api_client, namespaces.gated, pod)
    denial = DENIAL[ROUTING].match(outcome or "")
    assert denial, f"not refused: {outcome}"
    assert denial["message"] == (
        f'pod "{namespaces.gated}/own-0" requests nvidia.com/gpu but spec.schedulerName'
        f' is "team-sched"; GPU pods must set spec.schedulerName: {SCHEDULER}'
    )


def test_opa_gate_live_routing_refuses_a_pod_created_bound_to_a_node(
    routing: None, api_client: Any, namespaces: Namespaces
) -> None:
    bound: Any = gpu_pod("bound-0", GPU)
    bound.spec.node_name = "gpu-node-1"
    outcome = create(api_client, namespaces.gated, bound)
    assert denied_by(ROUTING, outcome), f"not refused: {outcome}"


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
    with engine_active("opa", control_plane, api_client, ns, GATE, opa_server):
        process.stop()
        try:
            # While OPA is down, failurePolicy Fail holds GPU pods back, and only them:
            # the webhook's match condition never sends other pods to OPA.
            outage = create(api_client, ns, gpu_pod("train-outage", GPU, scheduler=SCHEDULER))
            cpu_in_outage = create(api_client, ns, gpu_pod("web-outage", CPU))
            # Nor the GPU Operator's own pods, though its device plugin sets
            # NVIDIA_VISIBLE_DEVICES: they are never sent.
            operand_in_outage = _create_sample(
                control_plane, api_client, namespaces, INSTALLED, "operator-daemonset-operand"
            )
            started = time.monotonic()
            process.start()
            wait_for("OPA readiness after a restart", lambda: opa_ready(opa_server), process.tail)
            ready_s = time.monotonic() - started
            # Nothing was pushed: the restarted OPA judges from the files it read.
            denied = create(api_client, ns, gpu_pod("train-restart-0", GPU))
            admitted_pod = create(
                api_client, ns, gpu_pod("train-restart-1", GPU, scheduler=SCHEDULER)
            )
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
    assert admitted_pod is None


# ------------------------------------------------------------------ the sample table


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


def _sample_namespace(sample: Sample, namespaces: Namespaces, source: str) -> str:
    if sample.namespace == "operator":
        return namespaces.operators[source]
    return namespaces.serving if sample.namespace == "serving" else namespaces.gated


def _create_sample(
    cp: LocalControlPlane, admin: Any, namespaces: Namespaces, source: str, name: str
) -> str | None:
    """Dry-run create of the table's sample `name` as its creator, with the operator from
    `source`: None when admitted, else the API server's Status.message."""
    (sample,) = [s for s in SAMPLES.samples if s.name == name]
    pod: Any = sample.pod(name)  # the client sends a plain manifest as it is
    namespace = _sample_namespace(sample, namespaces, source)
    with _client_as(cp, sample.creator(namespaces.operators[source], namespace), admin) as who:
        return create(who, namespace, pod)


def _update(
    admin: Any, creator: Any, namespace: str, sample: Sample, name: str
) -> tuple[str | None, str | None]:
    """Create the sample's pod for real (bound to `sample.bind`), then update it (dry run):
    add its ephemeral container through pods/ephemeralcontainers, as `kubectl debug` does, or
    as its creator add its tolerations to the pod itself:
    (why the pod could not be made, or None; the update's refusal, or None)."""
    core, as_creator = client.CoreV1Api(admin), client.CoreV1Api(creator)
    try:
        manifest: Any = sample.pod(name)  # the client sends a plain manifest as it is
        as_creator.create_namespaced_pod(namespace, manifest)
    except ApiException as exc:
        return f"the pod itself was refused: {refusal(exc) or exc}", None
    try:
        if sample.bind is not None:
            binding = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name),
                target=client.V1ObjectReference(kind="Node", name=sample.bind),
            )
            # The Status it answers is no Binding: read raw.
            core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)
        pod: Any = core.read_namespaced_pod(name, namespace)
        try:
            if sample.debug is not None:
                pod.spec.ephemeral_containers = [
                    *(pod.spec.ephemeral_containers or []),
                    sample.debug_container(),
                ]
                core.replace_namespaced_pod_ephemeralcontainers(name, namespace, pod, dry_run="All")
            else:
                tolerations = [*(pod.spec.tolerations or []), *(sample.tolerate or [])]
                client.CoreV1Api(creator).patch_namespaced_pod(
                    name, namespace, {"spec": {"tolerations": tolerations}}, dry_run="All"
                )
        except ApiException as exc:
            message = refusal(exc)
            if message is None:
                raise
            return None, message
        return None, None
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def _routing_toleration_wrong(sample: Sample, api_client: Any, stored: Any, written: Any) -> str:
    """Under the routing engine, a GPU pod admitted onto the gate's scheduler tolerates the
    pool's taint, and the gate gives none to any other pod: what is wrong, or ""."""
    had = tolerates(stored_tolerations(api_client, written), POOL_TAINT)
    has = tolerates(stored_tolerations(api_client, stored), POOL_TAINT)
    on_gate = stored.spec.scheduler_name == SCHEDULER
    wanted = had or (on_gate and SAMPLES.asks_for_gpu(sample))
    if has == wanted:
        return ""
    state = "tolerates" if has else "does not tolerate"
    return f"admitted with schedulerName {stored.spec.scheduler_name} but {state} {POOL_TAINT}"


def _judge_table(
    engine: str,
    cp: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    source: str,
    opa: OpaServer | None,
) -> list[str]:
    """With `engine` in force (the operator from `source`), each sample's disagreement with
    the table, if any."""
    wrong: list[str] = []
    with engine_active(engine, cp, api_client, namespaces.gated, GATES[source], opa):
        for i, sample in enumerate(SAMPLES.samples):
            name = f"sample-{i}-{uuid.uuid4().hex[:4]}"
            namespace = _sample_namespace(sample, namespaces, source)
            pod: Any = sample.pod(name)
            written = pod["spec"].get("schedulerName", "default-scheduler")
            expected = sample.verdict(engine)
            wanted = sample.wanted(f"{namespace}/{name}", namespaces.serving)
            creator = sample.creator(namespaces.operators[source], namespace)
            with _client_as(cp, creator, api_client) as who:
                if sample.updates:
                    broken, message = _update(api_client, who, namespace, sample, name)
                    if broken is not None:
                        wrong.append(f"{engine} {sample.name}: {broken}")
                        continue
                    if message is None:
                        if expected != "allowed":
                            wrong.append(f"{engine} {sample.name}: update admitted")
                        continue
                else:
                    try:
                        stored = admitted(who, namespace, pod)
                    except ApiException as exc:
                        message = refusal(exc) or str(exc)
                    else:
                        scheduler = stored.spec.scheduler_name
                        routed = scheduler == SCHEDULER and written != SCHEDULER
                        outcome = "routed" if routed else "allowed"
                        if outcome == "allowed" and scheduler != written:
                            outcome = f"admitted with schedulerName {scheduler}"
                        if outcome != expected:
                            wrong.append(
                                f"{engine} {sample.name}: {outcome}, table says {expected}"
                            )
                        elif engine == ROUTING and (
                            why := _routing_toleration_wrong(sample, api_client, stored, pod)
                        ):
                            wrong.append(f"{engine} {sample.name}: {why}")
                        continue
            denial = DENIAL[engine].match(message)
            if denial is None:
                wrong.append(f"{engine} {sample.name}: not the gate's refusal: {message}")
            elif expected != "refused" or wanted not in denial["message"]:
                wrong.append(f"{engine} {sample.name}: refused ({denial['message']})")
    return wrong


@pytest.mark.parametrize("source", [INSTALLED, EXTERNAL])
def test_opa_gate_live_engines_reach_the_sample_tables_verdicts(
    control_plane: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    tmp_path: Path,
    source: str,
) -> None:
    """components/opa_gate/policies/samples.yaml: every engine, every sample, one verdict each, with the
    operator the stack installs and with one installed outside it."""
    with opa_serving(tmp_path / "opa", GATES[source].config) as opa:
        wrong = [
            line
            for engine in ENGINES
            for line in _judge_table(engine, control_plane, api_client, namespaces, source, opa)
        ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("engine", ENGINES)
def test_opa_gate_live_an_operator_outside_the_stack_is_known_only_by_its_namespace(
    control_plane: LocalControlPlane,
    api_client: Any,
    namespaces: Namespaces,
    tmp_path: Path,
    engine: str,
) -> None:
    """The gate set up for an operator outside the stack lets its validator's workload
    through in that operator's namespace, and refuses the same pod, from the same kind of
    account, in the namespace of the operator the stack would install."""
    external, elsewhere = namespaces.operators[EXTERNAL], namespaces.operators[INSTALLED]
    (sample,) = [s for s in SAMPLES.samples if s.name == "operator-plugin-validator-workload"]
    outcomes = {}
    with contextlib.ExitStack() as stack:
        opa = (
            stack.enter_context(opa_serving(tmp_path / "opa", GATES[EXTERNAL].config))
            if engine == "opa"
            else None
        )
        stack.enter_context(
            engine_active(engine, control_plane, api_client, namespaces.gated, GATES[EXTERNAL], opa)
        )
        for namespace in (external, elsewhere):
            creator = sample.creator(namespace, namespace)
            with _client_as(control_plane, creator, api_client) as who:
                outcomes[namespace] = create(who, namespace, sample.pod("validator-probe"))
    assert outcomes[external] is None, outcomes[external]
    assert denied_by(engine, outcomes[elsewhere]), outcomes[elsewhere]
