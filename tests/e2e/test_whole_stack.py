"""The whole program on a local cluster, then the workloads a user runs, for each stack shape.

Per stack (module-scoped: one cluster, one `up` for all of its scenarios, `destroy` last):
the program applied in the engine's order; a second `up` changes nothing; a GPU pod that sets
only its GPU request and the scheduler name is admitted, bound by the deployed scheduler and
stays Running; a GPU pod without the scheduler name is refused by the applied gate; CPU pods
never land on GPU nodes; the stack's own pods run; destroy leaves the nodes as they were.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .conftest import apply_stack, require_e2e_tools
from .engine import StackError, stack_config
from .providers import HELM_RELEASE
from .stack import AppliedStack

# The engine that routes GPU pods (components/opa_gate.py), and what both native engines and
# the webhook are named by.
ROUTING_ENGINE = "mutating-admission-policy"
GATE_NAME = "gpu-scheduler-gate"

GPU = "nvidia.com/gpu"
# An eviction by the taint manager happens within seconds of a binding.
SETTLE_SECONDS = 8.0


@pytest.fixture(scope="module", name="applied", params=["local", "dev", "prod"])
def applied_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppliedStack]:
    stack = str(request.param)
    yield from apply_stack(stack, tmp_path_factory.mktemp(f"e2e-{stack}"))


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _gpu_pod(name: str, scheduler: str | None, gpus: int = 1) -> dict[str, Any]:
    """A pod as a user writes it: the GPU limit and, maybe, the scheduler name; nothing else."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/cuda-job:1",
                "resources": {"limits": {GPU: str(gpus)}},
            }
        ]
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _wait_pod(core: Any, namespace: str, name: str, timeout: float = 60.0) -> Any:
    """The pod once Running; fails with its conditions if it is not Running in time."""
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Running":
            return pod
        if time.monotonic() > deadline:
            conditions = [(c.type, c.status, c.message) for c in pod.status.conditions or []]
            pytest.fail(f"pod {name} not Running after {timeout:.0f} s: {conditions}")
        time.sleep(0.5)


def _scheduled_by(core: Any, namespace: str, name: str) -> set[str]:
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason=Scheduled"
    ).items
    return {e.reporting_component or (e.source.component if e.source else "") for e in events}


def test_program_applied_in_dependency_order(applied: AppliedStack) -> None:
    """Every declared resource was created, and each after the resources it depends on."""
    engine = applied.engine
    if engine is None:
        pytest.skip("the real CLI orders resources itself")
    assert engine.order, "nothing was applied"
    assert {step.op for step in engine.steps} == {"create"}
    position = {key: i for i, key in enumerate(engine.order)}
    for key, dependencies in engine.dependencies.items():
        for dependency in dependencies:
            assert position[dependency] < position[key], f"{key} applied before {dependency}"


def test_second_up_changes_nothing(applied: AppliedStack) -> None:
    steps = applied.up()
    assert steps, "the second up registered nothing"
    assert [s for s in steps if s.op != "same"] == []


def test_gpu_pod_is_admitted_bound_by_the_stack_scheduler_and_stays(
    applied: AppliedStack, namespace: str
) -> None:
    core = _core(applied)
    scheduler = applied.outputs["schedulerName"]
    name = f"train-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(namespace, _gpu_pod(name, scheduler))
    pod = _wait_pod(core, namespace, name)
    assert pod.spec.node_name in applied.gpu_nodes
    assert _scheduled_by(core, namespace, name) == {scheduler}
    time.sleep(SETTLE_SECONDS)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.metadata.deletion_timestamp is None, "the GPU pod was evicted"
    assert pod.status.phase == "Running"


def test_gpu_pod_without_the_scheduler_name_is_refused_by_a_reject_only_gate(
    applied: AppliedStack, namespace: str
) -> None:
    if applied.outputs["admissionEngine"] == ROUTING_ENGINE:
        pytest.skip("the routing engine routes this pod (next scenario)")
    core = _core(applied)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, _gpu_pod("no-scheduler", None))
    assert refused.value.status in (400, 403, 422)
    assert "schedulerName" in str(refused.value.body)
    assert applied.outputs["schedulerName"] in str(refused.value.body)


def test_gpu_pod_without_the_scheduler_name_is_routed_bound_by_the_stack_scheduler_and_stays(
    applied: AppliedStack, namespace: str
) -> None:
    """The user writes only the GPU limit: the gate sets the scheduler and the pool's
    toleration, the stack's scheduler binds it to a GPU node, and it is not evicted."""
    if applied.outputs["admissionEngine"] != ROUTING_ENGINE:
        pytest.skip(f"the {applied.outputs['admissionEngine']} engine refuses this pod")
    core = _core(applied)
    scheduler = applied.outputs["schedulerName"]
    name = f"routed-{uuid.uuid4().hex[:6]}"
    created = core.create_namespaced_pod(namespace, _gpu_pod(name, None))
    assert created.spec.scheduler_name == scheduler
    # The pool's toleration, or one that covers it (ExtendedResourceToleration's for the
    # requested resource, when the pool is tainted with that key): never both.
    taint = applied.outputs["gpuTaint"]
    covering = [
        t
        for t in created.spec.tolerations or []
        if t.key == taint["key"]
        and (t.operator == "Exists" or t.value == taint["value"])
        and t.effect in (None, "", taint["effect"])
    ]
    assert len(covering) == 1, created.spec.tolerations
    pod = _wait_pod(core, namespace, name)
    assert pod.spec.node_name in applied.gpu_nodes
    assert _scheduled_by(core, namespace, name) == {scheduler}
    time.sleep(SETTLE_SECONDS)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.metadata.deletion_timestamp is None, "the routed GPU pod was evicted"
    assert pod.status.phase == "Running"


def test_gpu_pod_on_another_scheduler_is_refused_by_the_gate(
    applied: AppliedStack, namespace: str
) -> None:
    """A GPU pod that names a scheduler of its own cannot be routed: every engine refuses it."""
    core = _core(applied)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, _gpu_pod("own-scheduler", "team-scheduler"))
    assert refused.value.status in (400, 403, 422)
    message = json.loads(refused.value.body or "{}").get("message", "")
    assert 'spec.schedulerName is "team-scheduler"' in message
    assert applied.outputs["schedulerName"] in str(refused.value.body)


def test_gpu_pod_created_bound_to_a_node_is_refused_by_the_gate(
    applied: AppliedStack, namespace: str
) -> None:
    """spec.nodeName skips every scheduler: a GPU pod may not come bound, even with the name."""
    core = _core(applied)
    pod = _gpu_pod("bound", applied.outputs["schedulerName"])
    pod["spec"]["nodeName"] = applied.gpu_nodes[0]
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, pod)
    assert refused.value.status in (400, 403)
    assert "sets spec.nodeName, which skips the scheduler" in str(refused.value.body)


def test_cpu_pods_never_land_on_gpu_nodes(applied: AppliedStack, namespace: str) -> None:
    core = _core(applied)
    names = [f"web-{i}" for i in range(6)]
    for name in names:
        core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/web:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ]
                },
            },
        )
    nodes = {_wait_pod(core, namespace, name).spec.node_name for name in names}
    assert nodes and not nodes & set(applied.gpu_nodes)


def test_the_stack_pods_run_and_its_processes_serve(applied: AppliedStack) -> None:
    """Every pod the stack created is Running; the scheduler (and OPA) run as processes."""
    core = _core(applied)
    stack_pods = "app.kubernetes.io/part-of=gpu-cluster"
    pods = core.list_pod_for_all_namespaces(label_selector=stack_pods).items
    assert pods
    assert {p.metadata.name: p.status.phase for p in pods} == {
        p.metadata.name: "Running" for p in pods
    }
    assert applied.runtime is not None
    assert all(p.process.running() for p in applied.runtime.processes.values())
    assert any("kube-scheduler" in p.process.argv[0] for p in applied.runtime.processes.values())


def test_destroy_removes_what_the_stack_added_and_nodes_are_as_before(
    applied: AppliedStack,
) -> None:
    engine = applied.engine
    created = [] if engine is None else list(engine.of_prefix("kubernetes:"))
    created = [r for r in created if r.typ != HELM_RELEASE]
    during = applied.kubeadm_config()
    applied.destroy()
    assert applied.node_state() == applied.nodes_before
    # No admission policy, binding or webhook of the gate is left to judge pods.
    admission = client.AdmissionregistrationV1Api(applied.api_client())
    left: list[Any] = [
        item.metadata and item.metadata.name
        for listing in (
            admission.list_mutating_admission_policy,
            admission.list_mutating_admission_policy_binding,
            admission.list_validating_admission_policy,
            admission.list_validating_admission_policy_binding,
            admission.list_validating_webhook_configuration,
        )
        for item in listing().items
    ]
    assert GATE_NAME not in left
    # ControlPlaneFeatures edited kubeadm's ClusterConfiguration; destroy undid exactly that.
    if applied.kubeadm_config_before is not None:
        assert during != applied.kubeadm_config_before
    assert applied.kubeadm_config() == applied.kubeadm_config_before
    if engine is not None and applied.stand_ins is not None:
        assert engine.state == {}
        objects = applied.stand_ins.kubernetes
        assert [r.key for r in created if objects.exists(r)] == []


def test_a_no_execute_pool_is_refused_before_anything_is_applied(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Prod's pool with a NoExecute taint: GPU pods would only get NoSchedule tolerations from
    ExtendedResourceToleration (Pending) and the node agents would be evicted, so the config
    refuses it and the cluster is left exactly as it was."""
    require_e2e_tools()
    pool = json.loads(stack_config("prod")["gpu-cluster:gpuPool"])
    pool["taint"]["effect"] = "NoExecute"
    workdir = tmp_path_factory.mktemp("e2e-no-execute")
    with AppliedStack("prod", workdir, overrides={"gpuPool": pool}) as applied:
        namespaces = {n.metadata.name for n in _core(applied).list_namespace().items}
        with pytest.raises(StackError) as refused:
            applied.up()
        assert "gpu-cluster:gpuPool.taint.effect: got 'NoExecute'" in str(refused.value)
        assert applied.node_state() == applied.nodes_before
        assert {n.metadata.name for n in _core(applied).list_namespace().items} == namespaces


def test_a_scheduler_newer_than_the_api_server_is_refused_before_anything_is_applied(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """kubernetesVersion is the binpack kube-scheduler's image tag; one minor newer than the
    local API server (v1.37.2) breaks the version skew policy, so the program stops before it
    declares anything, naming the key and both versions."""
    require_e2e_tools()
    workdir = tmp_path_factory.mktemp("e2e-skew")
    with AppliedStack("local", workdir, overrides={"kubernetesVersion": "v1.38.0"}) as applied:
        namespaces = {n.metadata.name for n in _core(applied).list_namespace().items}
        with pytest.raises(StackError) as refused:
            applied.up()
        assert (
            "gpu-cluster:kubernetesVersion: got 'v1.38.0'; the cluster's API server is v1.37.2"
        ) in str(refused.value)
        assert "may not be newer than the kube-apiserver" in str(refused.value)
        assert "allowed: v1.36.x or v1.37.x" in str(refused.value)
        assert applied.node_state() == applied.nodes_before
        assert {n.metadata.name for n in _core(applied).list_namespace().items} == namespaces


# An image built from scheduler/ (README): the harness runs the built gpu-binpack-scheduler.
FRAGMENTATION_SCHEDULER = {
    "replicas": 1,
    "scoring": "fragmentation",
    "image": "registry.example.com/platform/gpu-binpack-scheduler:v1.37.2",
}


def test_the_fragmentation_scheduler_keeps_whole_nodes_for_whole_node_pods(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """scheduler.scoring fragmentation on the local stack (three 4-GPU nodes): the Deployment
    runs the image built from scheduler/ with the GpuFragmentation profile. Two 2-GPU pods share
    one node, so both 4-GPU pods after them still find a whole node: the default profile's
    spreading puts the second 2-GPU pod on another node and leaves one 4-GPU pod Pending."""
    require_e2e_tools()
    workdir = tmp_path_factory.mktemp("e2e-fragmentation")
    overrides = {"scheduler": FRAGMENTATION_SCHEDULER}
    with AppliedStack("local", workdir, overrides=overrides) as applied:
        applied.up()
        scheduler = applied.outputs["schedulerName"]
        config = applied.outputs["schedulerConfig"]
        assert "GpuFragmentation" in config
        processes = applied.runtime.processes.values() if applied.runtime else []
        assert any(p.process.argv[0].endswith("gpu-binpack-scheduler") for p in processes)
        core = _core(applied)
        namespace = f"fragmentation-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        nodes = []
        for name, gpus in (("two-a", 2), ("two-b", 2), ("four-a", 4), ("four-b", 4)):
            core.create_namespaced_pod(namespace, _gpu_pod(name, scheduler, gpus))
            pod = _wait_pod(core, namespace, name)
            assert _scheduled_by(core, namespace, name) == {scheduler}
            nodes.append(pod.spec.node_name)
        two_a, two_b, four_a, four_b = nodes
        assert two_a == two_b, f"2-GPU pods on {two_a} and {two_b}: a whole node was broken"
        assert len({two_a, four_a, four_b}) == 3
        core.delete_namespace(namespace)
        applied.destroy()
        assert applied.node_state() == applied.nodes_before
