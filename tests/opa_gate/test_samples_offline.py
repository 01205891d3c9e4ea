"""components/opa_gate/policies/samples.yaml judged without a cluster: the Rego policy by the real OPA (`opa eval`),
the CEL policies by the Kubernetes CEL libraries of the pinned release (tools/go/celgate,
compiled and evaluated as kube-apiserver's admission plugins do, the routing policy's JSON
patches applied). tests/integration/test_opa_gate_live.py runs the same table on a real
kube-apiserver.

What this leaves to the live suite: the API server's defaulting (here only what the verdicts
depend on: spec.schedulerName and requests from limits), the policies' matchConstraints and
namespaceSelector (every sample is in a judged namespace), the parameter lookup, and
authorization of the samples' creators.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.gpu_operator.settings import GpuOperatorSettings
from components.handoffs import OperatorPods
from components.opa_gate.manifests import (
    CLAIM_KINDS,
    admission_policy_spec,
    claim_policy_spec,
    claim_routing_policy_spec,
    claims_looked_up,
    gate_data,
    routing_policy_spec,
)
from components.opa_gate.settings import OpaGateSettings, load_policies
from components.tainted_gpu_pool.settings import Taint
from tests.integration.conftest import built_tool
from tests.opa_gate.gate_samples import (
    DRA_ENGINES,
    REFUSING_ENGINES,
    ROUTING_ENGINE,
    Identity,
    Namespace,
    Sample,
    load_samples,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAMPLES = load_samples()
SCHEDULER = SAMPLES.scheduler
POOL_TOLERATION = Taint.model_validate(SAMPLES.pool_taint).toleration()
GATED_NAMESPACE = "team-a"
# The namespace whose pods may name the stack's PriorityClasses without a GPU (`serving`).
SERVING_NAMESPACE = "ml-serving"
# Who creates a sample that names no creator: the cluster admin.
ADMIN = Identity(user="kubernetes-admin", groups=("system:masters", "system:authenticated"))
OPERATORS: dict[str, OperatorPods | None] = {
    "installed": GpuOperatorSettings.model_validate(
        {"enabled": True, "namespace": "gpu-operator"}
    ).operator_pods(),
    "external": GpuOperatorSettings().operator_pods(
        OpaGateSettings.model_validate(
            {"externalGpuOperatorNamespace": "nvidia-gpu-operator"}
        ).external_gpu_operator_namespace
    ),
}
ENGINES = (*REFUSING_ENGINES, ROUTING_ENGINE)


def _names(operator: OperatorPods | None) -> dict[Namespace, str]:
    """The name of each namespace kind of the sample table."""
    return {
        "gated": GATED_NAMESPACE,
        "operator": operator.namespace if operator is not None else "gpu-operator",
        "serving": SERVING_NAMESPACE,
    }


def _params(operator: OperatorPods | None) -> dict[str, str]:
    return gate_data(
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
    )


def _dra_params(operator: OperatorPods | None) -> dict[str, str]:
    """A DRA stack's gate data: the GPU DeviceClasses and their extended resource names."""
    return gate_data(
        SCHEDULER,
        SAMPLES.dra.gpu_resources,
        (),
        operator_pods=operator,
        pool_toleration=POOL_TOLERATION,
        gang_pods=SAMPLES.gang_pods,
        gang_namespaces=SAMPLES.gang_namespace_names(_names(operator)),
        **SAMPLES.pool_fence(_names(operator)),
        device_classes=SAMPLES.dra.device_classes,
        priority_classes=SAMPLES.priority_classes,
        priority_class_namespaces=[SERVING_NAMESPACE],
    )


def _operator_namespace(source: str) -> str:
    operator = OPERATORS[source]
    assert operator is not None
    return operator.namespace


def _defaulted(pod: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores before admission judges the pod, as far as the verdicts go:
    the default scheduler's name, and requests copied from limits."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    spec.setdefault("schedulerName", "default-scheduler")
    for field in ("containers", "initContainers"):
        for container in spec.get(field, []):
            resources = container.setdefault("resources", {})
            limits = resources.get("limits") or {}
            if limits:
                resources["requests"] = {**limits, **(resources.get("requests") or {})}
    return pod


def _request(sample: Sample, index: int, source: str) -> dict[str, Any]:
    """The admission request of a sample: a pod CREATE, or for a `debug` row the UPDATE of
    pods/ephemeralcontainers that adds its container to the pod, for a `tolerate` row the
    UPDATE of the pod that adds its tolerations, bound as `bind` says."""
    name = f"sample-{index}"
    operator = _operator_namespace(source)
    namespace = {"operator": operator, "serving": SERVING_NAMESPACE}.get(
        sample.namespace, GATED_NAMESPACE
    )
    creator = sample.creator(operator, namespace) or ADMIN
    pod = _defaulted(sample.pod(name))
    pod["metadata"]["namespace"] = namespace
    request: dict[str, Any] = {
        "name": name,
        "operation": "CREATE",
        "subResource": "",
        "namespace": namespace,
        "object": pod,
        "oldObject": None,
        "userInfo": {"username": creator.user, "groups": list(creator.groups)},
        # The routing policy matches pod creations only.
        "mutate": not sample.updates,
    }
    if sample.updates:
        old = copy.deepcopy(pod)
        if sample.bind is not None:
            old["spec"]["nodeName"] = sample.bind
        new = copy.deepcopy(old)
        if sample.debug is not None:
            new["spec"]["ephemeralContainers"] = [sample.debug_container()]
            request.update(subResource="ephemeralcontainers")
        else:
            new["spec"]["tolerations"] = [
                *old["spec"].get("tolerations", []),
                *(sample.tolerate or []),
            ]
        request.update(operation="UPDATE", object=new, oldObject=old)
    return request


def _review(request: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview the webhook sends OPA for `request`."""
    review = {
        "uid": request["name"],
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": request["operation"],
        "namespace": request["namespace"],
        "name": request["name"],
        "object": request["object"],
        "userInfo": request["userInfo"],
    }
    if request["subResource"]:
        review["subResource"] = request["subResource"]
    if request["oldObject"] is not None:
        review["oldObject"] = request["oldObject"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": review}


@pytest.fixture(scope="module")
def celgate() -> Path:
    """tools/go/celgate, built with the tools (tools/build-tools.sh celgate)."""
    return built_tool("celgate")


def _cel(celgate: Path, engine: str, params: dict[str, str], requests: list[Any]) -> list[Any]:
    """The CEL engine's results for `requests`; in DRA mode (`params` has device classes)
    with the claim policies, each evaluated once per object of its kind in the request's
    `lookups`."""
    routing, dra = engine == ROUTING_ENGINE, claims_looked_up(params)
    document = {
        "validating": admission_policy_spec(params),
        "mutating": routing_policy_spec(params) if routing else None,
        "params": None,
        "paramPolicies": [
            {
                "validating": claim_policy_spec(kind, params),
                "mutating": claim_routing_policy_spec(kind, params) if routing else None,
            }
            for kind in (CLAIM_KINDS if dra else ())
        ],
        "cases": requests,
    }
    done = subprocess.run(
        [str(celgate)], input=json.dumps(document), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    results: list[Any] = json.loads(done.stdout)
    return results


def _opa(opa: Path, tmp: Path, params: dict[str, str], requests: list[Any]) -> dict[str, Any]:
    """data.system.main for each request, by name, from one `opa eval`."""
    policies = tmp / "policies"
    policies.mkdir()
    for stem, source in load_policies().items():
        (policies / f"{stem}.rego").write_text(source)
    data = {
        "gpu_cluster": {"config": params},
        "samples": {r["name"]: _review(r) for r in requests},
    }
    (tmp / "data.json").write_text(json.dumps(data))
    query = "x := {name: d | some name, review in data.samples; d := data.system.main with input as review}"
    done = subprocess.run(
        [str(opa), "eval", "-f", "json", "-d", str(policies), "-d", str(tmp / "data.json"), query],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)["result"][0]["bindings"]["x"]
    return result


def _tolerates(tolerations: list[dict[str, str]]) -> bool:
    taint = SAMPLES.pool_taint
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists" or (t.get("value") or "") == taint.get("value", ""):
            return True
    return False


def _wrong(sample: Sample, engine: str, request: dict[str, Any], outcome: str, message: str) -> str:
    expected = sample.verdict(engine)
    wanted = sample.wanted(f"{request['namespace']}/{request['name']}", SERVING_NAMESPACE)
    if outcome != expected:
        return f"{engine} {sample.name}: {outcome} ({message}), table says {expected}"
    if outcome == "refused" and wanted not in message:
        return f"{engine} {sample.name}: refused with {message!r}, not {wanted!r}"
    return ""


@pytest.mark.parametrize("source", sorted(OPERATORS))
def test_samples_offline_every_engine_reaches_the_tables_verdicts(
    celgate: Path, tmp_path: Path, source: str
) -> None:
    opa = built_tool("opa")
    params = _params(OPERATORS[source])
    requests = [_request(s, i, source) for i, s in enumerate(SAMPLES.samples)]
    wrong: list[str] = []

    decisions = _opa(opa, tmp_path, params, requests)
    for sample, request in zip(SAMPLES.samples, requests, strict=True):
        response = decisions[request["name"]]["response"]
        outcome = "allowed" if response["allowed"] else "refused"
        message = response.get("status", {}).get("message", "")
        wrong.append(_wrong(sample, "opa", request, outcome, message))

    for engine in ("validating-admission-policy", ROUTING_ENGINE):
        results = _cel(celgate, engine, params, requests)
        wrong.extend(_cel_wrong(engine, SAMPLES.samples, requests, results, SAMPLES.asks_for_gpu))
    wrong = [w for w in wrong if w]
    assert not wrong, "\n".join(wrong)


def _cel_wrong(
    engine: str,
    samples: list[Sample],
    requests: list[dict[str, Any]],
    results: list[Any],
    asks_for_gpu: Callable[[Sample], bool],
) -> list[str]:
    """Each CEL result's disagreement with the table, if any (`asks_for_gpu`: whether a
    sample's pod is a GPU pod, which the routing engine gives the pool's toleration)."""
    wrong: list[str] = []
    for sample, request, result in zip(samples, requests, results, strict=True):
        if result.get("error"):
            wrong.append(f"{engine} {sample.name}: evaluation failed: {result['error']}")
            continue
        written = request["object"]["spec"]["schedulerName"]
        stored = result["object"]["spec"]
        if result["denied"]:
            outcome = "refused"
        elif stored.get("schedulerName") == SCHEDULER and written != SCHEDULER:
            outcome = "routed"
        elif stored.get("schedulerName") != written:
            outcome = f"admitted with schedulerName {stored.get('schedulerName')}"
        else:
            outcome = "allowed"
        wrong.append(_wrong(sample, engine, request, outcome, result["denied"]))
        if engine == ROUTING_ENGINE and request["mutate"] and outcome in ("allowed", "routed"):
            # A GPU pod admitted onto the gate's scheduler tolerates the pool's taint; the
            # gate gives none to any other pod.
            had = _tolerates(request["object"]["spec"].get("tolerations", []))
            has = _tolerates(stored.get("tolerations", []))
            on_gate = stored.get("schedulerName") == SCHEDULER
            if has != (had or (on_gate and asks_for_gpu(sample))):
                wrong.append(f"{engine} {sample.name}: tolerations {stored.get('tolerations')}")
    return [w for w in wrong if w]


@pytest.mark.parametrize("engine", DRA_ENGINES)
def test_samples_offline_dra_claims_are_gpus_by_the_class_they_name(
    celgate: Path, engine: str
) -> None:
    """The table's DRA rows under a DRA stack's gate data: a claim is a GPU request when the
    template or claim it names (the table's objects, in the pod's namespace) selects a GPU
    DeviceClass, exactly or as a firstAvailable alternative."""
    params = _dra_params(OPERATORS["installed"])
    dra = SAMPLES.dra
    requests = [
        {**_request(s, i, "installed"), "lookups": dra.lookups()} for i, s in enumerate(dra.samples)
    ]
    results = _cel(celgate, engine, params, requests)
    wrong = _cel_wrong(engine, dra.samples, requests, results, dra.asks_for_gpu)
    assert not wrong, "\n".join(wrong)


def test_samples_offline_dra_claims_without_objects_are_left_alone(celgate: Path) -> None:
    """No template or claim in the namespace: the claim policies are not evaluated at all
    (parameterNotFoundAction Allow), so a GPU-template pod is judged as one without claims."""
    (sample,) = [s for s in SAMPLES.dra.samples if s.name == "dra-gpu-template-without-scheduler"]
    request = {**_request(sample, 0, "installed"), "lookups": {}}
    for engine in DRA_ENGINES:
        (result,) = _cel(celgate, engine, _dra_params(OPERATORS["installed"]), [request])
        assert not result["denied"] and not result.get("error"), result
        assert result["object"]["spec"]["schedulerName"] == "default-scheduler"


def test_samples_offline_device_plugin_mode_counts_every_claim(celgate: Path) -> None:
    """The same GPU-template and NIC-template pods under a device-plugin stack's gate data:
    every claim is a GPU request, whatever it names (no claim policies)."""
    dra = SAMPLES.dra
    names = ("dra-gpu-template-without-scheduler", "dra-nic-template-left-alone")
    samples = [s for s in dra.samples if s.name in names]
    requests = [
        {**_request(s, i, "installed"), "lookups": dra.lookups()} for i, s in enumerate(samples)
    ]
    results = _cel(celgate, ROUTING_ENGINE, _params(OPERATORS["installed"]), requests)
    assert [r["object"]["spec"]["schedulerName"] for r in results] == [SCHEDULER, SCHEDULER]
