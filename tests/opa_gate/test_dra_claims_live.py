"""The DRA rows of components/opa_gate/policies/samples.yaml on a real cluster (LocalCluster: kube-apiserver,
kube-controller-manager, kube-scheduler, kwok), with the native engines' objects as OpaGate
renders them for a DRA stack: the parameter ConfigMap, the policies whose gpuNames leave
claims out, and the claim policies whose parameters are the ResourceClaimTemplates and
ResourceClaims of the pod's namespace, looked up by the API server itself.

The DeviceClasses are the DRA driver stand-in's (tools/harness/dra.py) and the table's other
classes (a NIC, a dongle), created here; the table's templates and claims are created in the
gated namespace. Pods are created with dryRun=All. What this leaves out: allocation (no
ResourceSlice is published; whether a claim can be satisfied is the scheduler's business, not
admission's).
"""

from __future__ import annotations

import contextlib
import re
import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from components.opa_gate.manifests import (
    CLAIM_KINDS,
    claim_policy_name,
    gate_data,
    native_objects,
)
from components.opa_gate.settings import GATE_NAME
from components.tainted_gpu_pool.settings import Taint
from tests.integration.conftest import require_tools
from tests.integration.gate_live import (
    admitted,
    create,
    refusal,
    stored_tolerations,
    tolerates,
    wait_for,
)
from tests.opa_gate.gate_samples import (
    DRA_ENGINES,
    RESOURCE_API,
    ROUTING_ENGINE,
    Namespace,
    Sample,
    load_samples,
)
from tools.harness import dra
from tools.harness.cluster import LocalCluster

pytestmark = pytest.mark.integration

SAMPLES = load_samples()
TABLE = SAMPLES.dra
SCHEDULER = SAMPLES.scheduler
POOL_TAINT = SAMPLES.pool_taint
GATE_NAMESPACE = "gpu-admission"
GATED_NAMESPACE = "team-a"
# The namespace whose pods may name the stack's PriorityClasses without a GPU (named in the
# gate data; no DRA row is created in it).
SERVING_NAMESPACE = "ml-serving"
API = "/apis/admissionregistration.k8s.io/v1"
# What the API server says when any of the gate's ValidatingAdmissionPolicies refuses a pod.
DENIAL = re.compile(
    r"^pods \"[^\"]+\" is forbidden: ValidatingAdmissionPolicy '(?P<policy>[^']+)' with binding"
    r" '[^']+' denied request: (?P<message>.*)$"
)
GATE_POLICIES = {GATE_NAME, *(claim_policy_name(k) for k in CLAIM_KINDS)}


# The name of each namespace kind of the sample table.
NAMES: dict[Namespace, str] = {
    "gated": GATED_NAMESPACE,
    "operator": "gpu-operator",
    "serving": SERVING_NAMESPACE,
}


def _params() -> dict[str, str]:
    """A DRA stack's gate data: the driver's GPU DeviceClasses and their extended resources."""
    return gate_data(
        SCHEDULER,
        TABLE.gpu_resources,
        (),
        pool_toleration=Taint.model_validate(POOL_TAINT).toleration(),
        gang_pods=SAMPLES.gang_pods,
        gang_namespaces=SAMPLES.gang_namespace_names(NAMES),
        **SAMPLES.pool_fence(NAMES),
        device_classes=TABLE.device_classes,
        priority_classes=SAMPLES.priority_classes,
        priority_class_namespaces=[SERVING_NAMESPACE],
    )


def _other_class(name: str) -> dict[str, Any]:
    """A DeviceClass of devices that are no GPU, as another driver's chart installs it."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{name}'"}}]},
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_tools("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
    with LocalCluster(base_dir=tmp_path_factory.mktemp("dra-gate")) as started:
        cp = started.control_plane
        dra.publish(started.api_client(), {})  # the driver's DeviceClasses, no slice
        for name in TABLE.other_classes:
            cp.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", _other_class(name))
        # The PriorityClasses the rows name (the Priority admission plugin refuses a pod whose
        # class does not exist).
        for priority_class in SAMPLES.priority_class_objects():
            cp.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", priority_class)
        for namespace in (GATE_NAMESPACE, GATED_NAMESPACE):
            cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        accounts = f"/api/v1/namespaces/{GATED_NAMESPACE}/serviceaccounts"
        wait_for(
            "the gated namespace's default ServiceAccount",
            lambda: bool(cp.request("GET", accounts)["items"]),
            lambda: started.logs()["kube-controller-manager"],
        )
        for obj in TABLE.objects:
            plural = f"{obj.kind.lower()}s"
            cp.request(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{GATED_NAMESPACE}/{plural}",
                obj.manifest(),
            )
        yield started


def _gate_objects(engine: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(collection, name, spec) of every object `engine` registers in DRA mode, policies
    before their bindings, as OpaGate declares them."""
    return native_objects(
        _params(), routing=engine == ROUTING_ENGINE, gate_namespace=GATE_NAMESPACE
    )


def _create(api_client: Any, pod: Any) -> str | None:
    """Dry-run create in the gated namespace: None when admitted, else the refusal."""
    return create(api_client, GATED_NAMESPACE, pod)


# For each claim kind, a sample naming a GPU object of that kind.
PROBES = {
    "ResourceClaimTemplate": "dra-gpu-template-without-scheduler",
    "ResourceClaim": "dra-existing-gpu-claim-without-scheduler",
}


def _probe(kind: str, scheduler: str | None = "team-scheduler") -> dict[str, Any]:
    """A pod naming a GPU `kind` object, on a scheduler of its own (refused by that kind's
    claim policy alone while it is in force), or on none (routed by its routing policy)."""
    (sample,) = [s for s in TABLE.samples if s.name == PROBES[kind]]
    pod = sample.pod(f"probe-{uuid.uuid4().hex[:6]}")
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    return pod


@contextlib.contextmanager
def _engine(cluster: LocalCluster, engine: str) -> Iterator[None]:
    """`engine`'s DRA-mode objects registered and in force (for each claim kind, a GPU pod on
    another scheduler refused by its claim policy and, routing, one on none routed); removed
    and forgotten afterwards."""
    cp, api_client = cluster.control_plane, cluster.api_client()
    made: list[str] = []
    last: list[str | None] = [None]

    def in_force() -> bool:
        for kind in CLAIM_KINDS:
            last[0] = _create(api_client, _probe(kind))
            found = DENIAL.match(last[0] or "")
            if found is None or found["policy"] != claim_policy_name(kind):
                return False
            if engine == ROUTING_ENGINE:
                try:
                    routed = admitted(api_client, GATED_NAMESPACE, _probe(kind, None))
                except ApiException as exc:
                    last[0] = refusal(exc)
                    return False
                if routed.spec.scheduler_name != SCHEDULER:
                    return False
        return True

    def forgotten() -> bool:
        return all(_create(api_client, _probe(kind)) is None for kind in CLAIM_KINDS)

    def diagnose() -> str:
        return f"last answer: {last[0]!r}\n{cluster.logs()['kube-apiserver']}"

    try:
        for collection, name, spec in _gate_objects(engine):
            cp.request("POST", f"{API}/{collection}", {"metadata": {"name": name}, "spec": spec})
            made.append(f"{API}/{collection}/{name}")
        wait_for(f"{engine}'s claim policies in force", in_force, diagnose)
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(urllib.error.HTTPError):
                cp.request("DELETE", path)
    wait_for(f"{engine} removed", forgotten, diagnose)


def _wrong(sample: Sample, engine: str, api_client: Any, name: str) -> str:
    """The sample's disagreement with the table under `engine`, or ""."""
    pod = sample.pod(name)
    written = pod["spec"].get("schedulerName", "default-scheduler")
    expected = sample.verdict(engine)
    try:
        stored = admitted(api_client, GATED_NAMESPACE, pod)
    except ApiException as exc:
        message = refusal(exc) or str(exc)
        denial = DENIAL.match(message)
        if denial is None or denial["policy"] not in GATE_POLICIES:
            return f"{engine} {sample.name}: not the gate's refusal: {message}"
        wanted = sample.wanted(f"{GATED_NAMESPACE}/{name}", SERVING_NAMESPACE)
        if expected != "refused" or wanted not in denial["message"]:
            return f"{engine} {sample.name}: refused ({denial['message']})"
        return ""
    scheduler = stored.spec.scheduler_name
    outcome = "routed" if scheduler == SCHEDULER and written != SCHEDULER else "allowed"
    if outcome == "allowed" and scheduler != written:
        outcome = f"admitted with schedulerName {scheduler}"
    if outcome != expected:
        return f"{engine} {sample.name}: {outcome}, table says {expected}"
    if engine == ROUTING_ENGINE:
        had = tolerates(stored_tolerations(api_client, pod), POOL_TAINT)
        has = tolerates(stored_tolerations(api_client, stored), POOL_TAINT)
        if has != (had or (scheduler == SCHEDULER and TABLE.asks_for_gpu(sample))):
            return f"{engine} {sample.name}: tolerations {stored.spec.tolerations}"
    return ""


@pytest.mark.parametrize("engine", DRA_ENGINES)
def test_dra_claims_live_engines_reach_the_tables_verdicts(
    cluster: LocalCluster, engine: str
) -> None:
    """Every DRA row: a GPU-class template or claim (exactly, or a firstAvailable alternative)
    routed or refused, a NIC's or a dongle's left alone, on the real kube-apiserver."""
    api_client = cluster.api_client()
    with _engine(cluster, engine):
        wrong = [
            _wrong(sample, engine, api_client, f"dra-{i}-{uuid.uuid4().hex[:4]}")
            for i, sample in enumerate(TABLE.samples)
        ]
    wrong = [w for w in wrong if w]
    assert not wrong, "\n".join(wrong)


def test_dra_claims_live_policies_type_check_clean(cluster: LocalCluster) -> None:
    """The API server type-checks each ValidatingAdmissionPolicy against its paramKind's
    schema (ResourceClaimTemplate, ResourceClaim) and reports no warning on any expression
    (MutatingAdmissionPolicies get no such status; the table's verdicts cover them)."""
    cp = cluster.control_plane
    with _engine(cluster, ROUTING_ENGINE):
        statuses = {}
        for collection, name, _ in _gate_objects(ROUTING_ENGINE):
            if collection == "validatingadmissionpolicies":

                def checked(c: str = collection, n: str = name) -> bool:
                    status = cp.request("GET", f"{API}/{c}/{n}").get("status", {})
                    statuses[(c, n)] = status
                    return "observedGeneration" in status

                wait_for(f"{collection}/{name} type-checked", checked, lambda: str(statuses))
    warnings = {
        key: status["typeChecking"]["expressionWarnings"]
        for key, status in statuses.items()
        if status.get("typeChecking", {}).get("expressionWarnings")
    }
    assert len(statuses) == 1 + len(CLAIM_KINDS)
    assert not warnings, warnings
