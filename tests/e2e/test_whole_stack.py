"""The whole program on a local cluster, then the workloads a user runs, for each stack shape.

Per stack (module-scoped: one cluster, one `pulumi up` for all of its scenarios, `pulumi
destroy` last): the pool tainted only after what must come first; each Helm release got its
values; a second `up` changes nothing; a GPU pod that sets
only its GPU request and the scheduler name is admitted, bound by the deployed scheduler and
stays Running; a GPU pod without the scheduler name is refused by the applied gate; CPU pods
never land on GPU nodes, whatever a tenant creates or edits; the stack's own pods run; destroy
leaves the nodes as they were.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.opa_gate.settings import DEFAULT_GATE_NAMESPACE
from tools.harness import gangs
from tools.harness.charts import release_values
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack, StackError

from .conftest import apply_stack, require_e2e_tools, scheduled_by

# The engine that routes GPU pods (components/opa_gate/settings.py), and what both native engines and
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


def _state(applied: AppliedStack) -> dict[str, dict[str, Any]]:
    """The stack's state (`pulumi stack export`), by URN."""
    return {r["urn"]: r for r in applied.engine.resources()}


def _under(state: dict[str, dict[str, Any]], urn: str, component_type: str) -> bool:
    """Whether `urn` is, or is a descendant of, a component of `component_type`."""
    while urn:
        resource = state[urn]
        if resource["type"] == component_type:
            return True
        urn = resource.get("parent") or ""
    return False


def test_the_pool_is_tainted_after_the_resources_and_the_admission_plugin(
    applied: AppliedStack,
) -> None:
    """The engine created the pool's node writes only after the extended resources (both
    write the same Node objects) and, where the stack edits the control plane, after
    ExtendedResourceToleration is on (GPU pods admitted before it would lack tolerations)."""
    state = _state(applied)
    pool = [
        r
        for urn, r in state.items()
        if r.get("custom") and _under(state, urn, "gpu-cluster:index:TaintedGpuPool")
    ]
    assert pool, "no resource of the pool in the state"
    wanted = ["gpu-cluster:index:ExtendedResourceNodes"]
    if applied.outputs.get("controlPlaneHosts") is not None:
        wanted.append("gpu-cluster:index:ControlPlaneFeatures")
    for resource in pool:
        for component in wanted:
            assert any(_under(state, dep, component) for dep in resource["dependencies"]), (
                f"{resource['urn']} does not wait for {component}"
            )


def test_each_helm_release_got_its_values(applied: AppliedStack) -> None:
    """The kubernetes provider installed the pinned charts with the values the stack computed:
    the GPU Operator's operands tolerate the pool's taint; Grafana reads its admin password
    from a Secret, never from the values."""
    core = _core(applied)
    outputs = applied.outputs
    taint = outputs["gpuTaint"]
    if "gpuOperatorRelease" in outputs:
        assert outputs["gpuOperatorRelease"] == "deployed"
        values = release_values(core, outputs["gpuOperatorNamespace"], "gpu-operator")
        tolerations = values["daemonsets"]["tolerations"]
        assert {
            "key": taint["key"],
            "operator": "Equal",
            "value": taint["value"],
            "effect": taint["effect"],
        } in tolerations
        operator = stack_config(applied.stack)["gpuOperator"]
        assert values["driver"]["enabled"] == bool(
            (operator.get("driver") or {}).get("enabled", True)
        )
    if "monitoringRelease" in outputs:
        assert outputs["monitoringRelease"] == "deployed"
        namespace = (stack_config(applied.stack)["monitoring"] or {}).get("namespace")
        values = release_values(core, namespace or "monitoring", "kube-prometheus-stack")
        admin = values["grafana"]["admin"]
        assert admin["existingSecret"]
        assert "adminPassword" not in values["grafana"]


def test_second_up_changes_nothing(applied: AppliedStack) -> None:
    changes = applied.up()
    assert applied.engine.steps, "the second up registered nothing"
    assert changes == []


def test_gpu_pod_is_admitted_bound_by_the_stack_scheduler_and_stays(
    applied: AppliedStack, namespace: str
) -> None:
    core = _core(applied)
    scheduler = applied.outputs["schedulerName"]
    name = f"train-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(namespace, _gpu_pod(name, scheduler))
    pod = _wait_pod(core, namespace, name)
    assert pod.spec.node_name in applied.gpu_nodes
    assert scheduled_by(core, namespace, name) == {scheduler}
    time.sleep(SETTLE_SECONDS)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.metadata.deletion_timestamp is None, "the GPU pod was evicted"
    assert pod.status.phase == "Running"


def test_gpu_pod_of_a_stack_priority_class_runs_with_its_priority(
    applied: AppliedStack, namespace: str
) -> None:
    classes = applied.outputs.get("gpuPriorityClasses")
    if not classes:
        pytest.skip(f"stack {applied.stack} creates no priority classes (priorityClasses.enabled)")
    scheduling = client.SchedulingV1Api(applied.api_client())
    wanted = scheduling.read_priority_class(classes[0])
    core = _core(applied)
    name = f"serve-{uuid.uuid4().hex[:6]}"
    pod = _gpu_pod(name, applied.outputs["schedulerName"])
    pod["spec"]["priorityClassName"] = classes[0]
    core.create_namespaced_pod(namespace, pod)
    running = _wait_pod(core, namespace, name)
    assert running.spec.priority == wanted.value
    assert running.spec.node_name in applied.gpu_nodes


def test_a_gang_of_gpu_workers_waits_whole_while_the_pool_is_full_then_starts_whole(
    applied: AppliedStack, namespace: str
) -> None:
    """An indexed Job of GPU workers and a CPU-only launcher in one PodGroup (gang, minCount
    = all of them), as a user submits a distributed job, none naming a scheduler: the gate
    routes every member to the stack's scheduler, the launcher too; with room for all but one
    worker none is bound; once room appears every member is bound by it and starts."""
    if not stack_config(applied.stack).get("scheduler", {}).get("gangScheduling"):
        pytest.skip(f"stack {applied.stack} leaves scheduler.gangScheduling off")
    core = _core(applied)
    scheduler = applied.outputs["schedulerName"]
    workers = 3
    free = gangs.fill_pool(core, namespace, applied.gpu_nodes, leave=workers - 1)
    gang = gangs.submit_gang(
        applied.api_client(), namespace, f"train-{uuid.uuid4().hex[:6]}", workers
    )
    gang.wait_created(core)
    launcher = core.read_namespaced_pod(gang.launcher, namespace)
    assert launcher.spec.scheduler_name == scheduler, "the launcher was not routed"
    assert not [t for t in launcher.spec.tolerations or [] if t.key == GPU]
    time.sleep(2 * SETTLE_SECONDS)
    assert gang.bound(core) == {}, "part of the gang was bound"

    core.delete_namespaced_pod(free[0], namespace, grace_period_seconds=0)
    started = gang.wait_started(core)
    assert started.pop(gang.launcher) not in applied.gpu_nodes, "the launcher is on the pool"
    assert set(started.values()) <= set(applied.gpu_nodes)
    for name in [*started, gang.launcher]:
        assert scheduled_by(core, namespace, name) == {scheduler}


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
    assert scheduled_by(core, namespace, name) == {scheduler}
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


def _cpu_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A pod that asks for no GPU, with `spec` fields added."""
    container = {
        "name": "main",
        "image": "registry.invalid/web:1",
        "resources": {"requests": {"cpu": "100m"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container], **spec},
    }


def _refused(create: Any) -> str:
    """The gate's refusal of `create()` (an ApiException 403's message)."""
    with pytest.raises(ApiException) as refused:
        create()
    assert refused.value.status in (400, 403), refused.value
    message = str(json.loads(refused.value.body or "{}").get("message", ""))
    assert "the pool's nodes take GPU pods" in message, message
    return message


def test_no_pod_without_a_gpu_reaches_a_gpu_node_whatever_a_tenant_creates_or_edits(
    applied: AppliedStack, namespace: str
) -> None:
    """In a namespace outside admission.poolNamespaces, a pod that asks for no GPU is refused
    bound to a pool node (the kubelet checks only NoExecute taints), tolerating every taint,
    or given such a toleration by an update while Pending; a DaemonSet that tolerates every
    taint gets no pod; in the monitoring namespace the same pod is admitted."""
    core, apps = _core(applied), client.AppsV1Api(applied.api_client())
    node = applied.gpu_nodes[0]
    every_taint = [{"operator": "Exists"}]
    assert "spec.nodeName is" in _refused(
        lambda: core.create_namespaced_pod(namespace, _cpu_pod("bound", nodeName=node))
    )
    assert "but tolerates the GPU pool's taint" in _refused(
        lambda: core.create_namespaced_pod(namespace, _cpu_pod("open", tolerations=every_taint))
    )
    waiting = _cpu_pod("waiting", nodeSelector={"kubernetes.io/hostname": node})
    core.create_namespaced_pod(namespace, waiting)
    # A pod's tolerations may only grow: the update keeps those the API server gave it.
    given = core.read_namespaced_pod("waiting", namespace).spec.tolerations or []
    grown = [*(core.api_client.sanitize_for_serialization(t) for t in given), *every_taint]
    assert "is updated to tolerate the GPU pool's taint" in _refused(
        lambda: core.patch_namespaced_pod("waiting", namespace, {"spec": {"tolerations": grown}})
    )
    template = _cpu_pod("agent", tolerations=every_taint)
    daemon_set: Any = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    apps.create_namespaced_daemon_set(namespace, daemon_set)

    def refused_creates() -> list[str]:
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=agent,reason=FailedCreate"
        ).items
        return [e.message for e in events if "the pool's nodes take GPU pods" in (e.message or "")]

    deadline = time.monotonic() + 60.0
    while not refused_creates() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert refused_creates(), "the DaemonSet controller's pod creates were not refused"
    time.sleep(SETTLE_SECONDS)
    pods = core.list_namespaced_pod(namespace).items
    assert [p.metadata.name for p in pods] == ["waiting"]
    assert not core.read_namespaced_pod("waiting", namespace).spec.node_name
    # The monitoring namespace is the pool's (its node agents run on every node): the same pod
    # is admitted there (a dry run: the local charts run no node agent of their own).
    monitoring = stack_config(applied.stack).get("monitoring") or {}
    if monitoring.get("enabled"):
        agent = _cpu_pod("node-agent", nodeName=node, tolerations=every_taint)
        core.create_namespaced_pod(monitoring.get("namespace", "monitoring"), agent, dry_run="All")


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


def _secret_values(applied: AppliedStack) -> dict[str, str]:
    """The secrets this stack holds, as they would appear in plain text."""
    found = {}
    kubeconfig = yaml.safe_load(applied.cluster.control_plane.kubeconfig_yaml())
    user = kubeconfig["users"][0]["user"]
    found["kubeconfig client key"] = user["client-key-data"]
    found["kubeconfig client key (decoded)"] = base64.b64decode(user["client-key-data"]).decode()
    config = yaml.safe_load(
        (applied.engine.project_dir / f"Pulumi.{applied.name}.yaml").read_text()
    )["config"]
    if "gpu-cluster:grafanaAdminPassword" in config:
        found["Grafana password"] = applied.engine.stack.get_config(
            "gpu-cluster:grafanaAdminPassword"
        ).value
    if applied.outputs["admissionEngine"] == "opa":
        namespace = (stack_config(applied.stack).get("admission") or {}).get("namespace")
        secret = _core(applied).read_namespaced_secret(
            "opa-serving", namespace or DEFAULT_GATE_NAMESPACE
        )
        key = base64.b64decode(secret.data["tls.key"]).decode()
        found["OPA serving key"] = key
        found["OPA serving key (body)"] = "".join(key.strip().splitlines()[1:-1])
    return found


def test_no_secret_in_plain_text_in_the_stack_export(applied: AppliedStack) -> None:
    """`pulumi stack export` holds the kubeconfig, the Grafana password and the TLS keys only
    encrypted: none of them appears in plain text, not even inside another value."""
    exported = applied.engine.cli("stack", "export")
    assert '"ciphertext"' in exported
    secrets = _secret_values(applied)
    for name, value in secrets.items():
        assert value and value not in exported, f"{name} in plain text in the stack export"
        assert json.dumps(value)[1:-1] not in exported, f"{name} (JSON-escaped) in the export"


def test_a_renamed_host_keeps_its_commands(applied: AppliedStack) -> None:
    """A control-plane host renamed in the inventory, with its old name in previousNames,
    keeps its SSH commands (Pulumi aliases): nothing is deleted on the old name or created on
    the new, so no host is regenerated for a rename."""
    config = stack_config(applied.stack)
    control = config.get("controlPlane") or {}
    if not control.get("enabled"):
        pytest.skip("this stack does not edit the control plane")
    old = control["hosts"][0]
    new = f"{old}-renamed"
    nodes = [
        {**n, "name": new, "previousNames": [old]} if n["name"] == old else n
        for n in config["nodes"]
    ]

    def renamed(names: list[str]) -> list[str]:
        return [new if n == old else n for n in names]

    control = {
        **control,
        "hosts": renamed(control["hosts"]),
        "kubeletHosts": renamed(control.get("kubeletHosts") or []),
        "hostKeys": {new if k == old else k: v for k, v in control["hostKeys"].items()},
    }
    applied.set_config({"nodes": nodes, "controlPlane": control})
    recorded = len(applied.recorded_commands())
    planned = applied.preview()
    commands = [s for s in applied.engine.steps if s.type == "command:remote:Command"]
    assert commands, "the preview saw no command"
    assert [(op, urn) for op, urn in planned if "command:remote" in urn and op != "update"] == []
    applied.up()
    assert {c["op"] for c in applied.recorded_commands()[recorded:]} <= {"update"}


def test_destroy_removes_what_the_stack_added_and_nodes_are_as_before(
    applied: AppliedStack,
) -> None:
    created = applied.kubernetes_objects()
    assert created, "the state holds no Kubernetes object"
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
    assert [r["type"] for r in applied.engine.resources()] in ([], ["pulumi:pulumi:Stack"])
    assert [o for o in created if applied.exists(o)] == []


def test_a_no_execute_pool_is_refused_before_anything_is_applied(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Prod's pool with a NoExecute taint: GPU pods would only get NoSchedule tolerations from
    ExtendedResourceToleration (Pending) and the node agents would be evicted, so the config
    refuses it and the cluster is left exactly as it was."""
    require_e2e_tools()
    pool = dict(stack_config("prod")["gpuPool"])
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
            assert scheduled_by(core, namespace, name) == {scheduler}
            nodes.append(pod.spec.node_name)
        two_a, two_b, four_a, four_b = nodes
        assert two_a == two_b, f"2-GPU pods on {two_a} and {two_b}: a whole node was broken"
        assert len({two_a, four_a, four_b}) == 3
        core.delete_namespace(namespace)
        applied.destroy()
        assert applied.node_state() == applied.nodes_before
