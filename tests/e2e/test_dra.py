"""The whole program in DRA mode on a local cluster: GPUs allocated through Dynamic Resource
Allocation instead of the device plugin, then the workloads a user runs.

The local stack with `gpuOperator.allocation: dra` (chart v26.7.0, the first with GPUCluster)
and the GpuFragmentation scoring. Its GPU nodes advertise no nvidia.com/gpu: once the
operator's release is in, the DRA driver stand-in (tools/harness/dra.py) publishes the driver's
DeviceClasses and each pool node's ResourceSlice of 4 GPUs, as the driver's kubelet plugins
would. The real kube-controller-manager makes claims from templates and the stack's scheduler
allocates them. A pod whose claim asks for a GPU class is routed by the gate and bound by the
stack's scheduler; a pod whose claim asks for another device (a NIC) is left to the default
scheduler; a second `up` changes nothing; `destroy` removes what the stack made and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, dynamic

from components.gpu_resources import DEVICE_CLASS_RESOURCE_PREFIX, GPU_DEVICE_CLASS
from tools.harness import dra
from tools.harness.charts import release_values
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack

from .conftest import apply_stack, scheduled_by, wait_for

DRA_OPERATOR = {
    **stack_config("local")["gpuOperator"],
    "allocation": "dra",
    "version": "v26.7.0",
}
# The image built from scheduler/ (the harness runs the built gpu-binpack-scheduler).
FRAGMENTATION_SCHEDULER = {
    **stack_config("local")["scheduler"],
    "scoring": "fragmentation",
    "image": "registry.example.com/platform/gpu-binpack-scheduler:v1.37.2",
}
# Where the routes around the gate are tried: a namespace of admission.poolNamespaces, whose
# pods may tolerate the pool's taint without a GPU, so only the allocation policy stands
# between them and a GPU (elsewhere the gate refuses such a pod at admission).
ROUTES_NAMESPACE = "dra-routes"
OVERRIDES = {
    "gpuOperator": DRA_OPERATOR,
    "scheduler": FRAGMENTATION_SCHEDULER,
    "admission": {**stack_config("local")["admission"], "poolNamespaces": [ROUTES_NAMESPACE]},
}
# A device of another driver: a NIC, published on the CPU node.
NIC_DRIVER = "nic.example.com"
NIC_CLASS = "nic.example.com"
DEFAULT_SCHEDULER = "default-scheduler"
WAIT_SECONDS = 90.0


@pytest.fixture(scope="module", name="applied")
def applied_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppliedStack]:
    workdir = tmp_path_factory.mktemp("e2e-dra")
    yield from apply_stack("local", workdir, overrides=OVERRIDES)


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _resource(applied: AppliedStack, kind: str) -> Any:
    api = dynamic.DynamicClient(applied.api_client())
    return api.resources.get(api_version=dra.RESOURCE_API, kind=kind)


def _wait(what: str, check: Any, timeout: float = WAIT_SECONDS) -> Any:
    return wait_for(what, check, timeout)


def _running(core: Any, namespace: str, name: str) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    try:
        return _wait(f"pod {name} Running", check)
    except pytest.fail.Exception:
        pod = core.read_namespaced_pod(name, namespace)
        conditions = [(c.type, c.status, c.message) for c in pod.status.conditions or []]
        pytest.fail(f"pod {name} not Running: {conditions}")


def _template(
    applied: AppliedStack, namespace: str, name: str, device_class: str, count: int
) -> None:
    body = dra.claim_template(name, device_class, count)
    _resource(applied, "ResourceClaimTemplate").create(body=body, namespace=namespace)


def _claim_pod(name: str, template: str, scheduler: str | None = None) -> dict[str, Any]:
    """A pod as a user writes it: one claim from `template`, maybe a scheduler name."""
    extra = {"schedulerName": scheduler} if scheduler else {}
    spec = dra.claim_pod_spec(
        template, [{"name": "main", "image": "registry.invalid/cuda-job:1"}], **extra
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _allocated(applied: AppliedStack, namespace: str, pod: str) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every device allocated to the claims made for `pod`."""
    held = []
    for claim in _resource(applied, "ResourceClaim").get(namespace=namespace).items:
        owners = claim.metadata.ownerReferences or []
        if not any(o.kind == "Pod" and o.name == pod for o in owners):
            continue
        allocation = (claim.status or {}).get("allocation") if claim.status else None
        for result in (allocation or {}).get("devices", {}).get("results", []) or []:
            held.append((result["driver"], result["pool"], result["device"]))
    return held


def _held_gpus(applied: AppliedStack) -> list[tuple[str, str, str]]:
    """(namespace, claim, device) of every GPU some claim holds, in any namespace."""
    held = []
    for claim in _resource(applied, "ResourceClaim").get().items:
        allocation = (claim.status or {}).get("allocation") if claim.status else None
        for result in (allocation or {}).get("devices", {}).get("results", []) or []:
            if result["driver"] == dra.DRIVER:
                held.append((claim.metadata.namespace, claim.metadata.name, result["device"]))
    return held


def test_the_operator_deploys_the_dra_driver_instead_of_the_device_plugin(
    applied: AppliedStack,
) -> None:
    outputs = applied.outputs
    assert outputs["gpuOperatorChart"] == "v26.7.0"
    assert outputs["gpuDeviceClasses"] == ["gpu.nvidia.com", "mig.nvidia.com"]
    values = release_values(_core(applied), outputs["gpuOperatorNamespace"], "gpu-operator")
    assert values["gpuCluster"]["deployCR"] is True
    assert values["clusterPolicy"]["deployCR"] is False
    assert values["devicePlugin"]["enabled"] is False
    for name in applied.gpu_nodes:
        allocatable = _core(applied).read_node(name).status.allocatable
        assert not any(key.startswith("nvidia.com/") for key in allocatable), allocatable


def test_second_up_changes_nothing(applied: AppliedStack) -> None:
    assert applied.up() == []


def test_a_gpu_claim_pod_is_routed_and_bound_by_the_stack_scheduler_with_its_devices(
    applied: AppliedStack, namespace: str
) -> None:
    """No scheduler name: the gate routes the pod because its claim's template asks for the
    GPU class; the stack's scheduler allocates two GPUs of one pool node and binds the pod."""
    core = _core(applied)
    _template(applied, namespace, "two-gpus", GPU_DEVICE_CLASS, 2)
    core.create_namespaced_pod(namespace, _claim_pod("train", "two-gpus"))
    pod = _running(core, namespace, "train")
    scheduler = applied.outputs["schedulerName"]
    assert pod.spec.scheduler_name == scheduler
    assert scheduled_by(core, namespace, "train") == {scheduler}
    assert pod.spec.node_name in applied.gpu_nodes
    held = _allocated(applied, namespace, "train")
    assert len(held) == 2, held
    assert {(driver, pool) for driver, pool, _ in held} == {(dra.DRIVER, pod.spec.node_name)}


def test_claim_pods_leave_whole_nodes_for_whole_node_claims(
    applied: AppliedStack, namespace: str
) -> None:
    """GpuFragmentation reads the slices and the claims: two 2-GPU claim pods share a node, so
    both 4-GPU claim pods after them still find a whole node."""
    core = _core(applied)
    _wait("the GPUs of earlier scenarios released", lambda: not _held_gpus(applied))
    _template(applied, namespace, "two", GPU_DEVICE_CLASS, 2)
    _template(applied, namespace, "four", GPU_DEVICE_CLASS, 4)
    nodes = []
    for name, template in (
        ("two-a", "two"),
        ("two-b", "two"),
        ("four-a", "four"),
        ("four-b", "four"),
    ):
        core.create_namespaced_pod(namespace, _claim_pod(name, template))
        nodes.append(_running(core, namespace, name).spec.node_name)
    two_a, two_b, four_a, four_b = nodes
    assert two_a == two_b, f"2-GPU claim pods on {two_a} and {two_b}: a whole node was broken"
    assert len({two_a, four_a, four_b}) == 3


def test_a_pod_asking_for_the_gpu_class_as_an_extended_resource_is_routed_and_bound(
    applied: AppliedStack, namespace: str
) -> None:
    """DRAExtendedResource: `deviceclass.resource.kubernetes.io/gpu.nvidia.com: 1` is a GPU
    request; the scheduler allocates one GPU of the node for it."""
    core = _core(applied)
    resource = f"{DEVICE_CLASS_RESOURCE_PREFIX}{GPU_DEVICE_CLASS}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "infer"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-job:1",
                    "resources": {"limits": {resource: "1"}},
                }
            ]
        },
    }
    core.create_namespaced_pod(namespace, pod)
    running = _running(core, namespace, "infer")
    scheduler = applied.outputs["schedulerName"]
    assert scheduled_by(core, namespace, "infer") == {scheduler}
    assert running.spec.node_name in applied.gpu_nodes
    status = running.status.extended_resource_claim_status
    assert status is not None and status.resource_claim_name, running.status


@pytest.fixture(name="nic")
def nic_fixture(applied: AppliedStack) -> Iterator[str]:
    """A NIC driver's DeviceClass and slice on the CPU node (another team's device); removed
    afterwards. Returns the node."""
    (node,) = [n.name for n in applied.nodes if n.name not in applied.gpu_nodes]
    device_class = {
        "apiVersion": dra.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": NIC_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NIC_DRIVER}'"}}]},
    }
    nic_slice: dict[str, Any] = {
        "apiVersion": dra.RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NIC_DRIVER}"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "eth1"}],
        },
    }
    _resource(applied, "DeviceClass").create(body=device_class)
    _resource(applied, "ResourceSlice").create(body=nic_slice)
    yield node
    _resource(applied, "ResourceSlice").delete(name=nic_slice["metadata"]["name"])
    _resource(applied, "DeviceClass").delete(name=NIC_CLASS)


def test_a_nic_claim_pod_is_not_routed(applied: AppliedStack, namespace: str, nic: str) -> None:
    """A claim for another device is no GPU request: the gate leaves the pod to the default
    scheduler, which allocates the NIC on the node that has it."""
    core = _core(applied)
    _template(applied, namespace, "nic", NIC_CLASS, 1)
    core.create_namespaced_pod(namespace, _claim_pod("fetch", "nic"))
    pod = _running(core, namespace, "fetch")
    assert pod.spec.scheduler_name == DEFAULT_SCHEDULER
    assert scheduled_by(core, namespace, "fetch") == {DEFAULT_SCHEDULER}
    assert pod.spec.node_name == nic
    assert _allocated(applied, namespace, "fetch") == [(NIC_DRIVER, nic, "eth1")]


# ------------------------------------------------------------------ routes around the gate
#
# Each route leads a GPU claim to the cluster's own scheduler, which would allocate a free GPU
# of a pool node (it tolerates every taint). The allocation policy lets only the stack's
# scheduler write that allocation: the pod stays Pending, its FailedScheduling event says what
# to do, and no GPU is allocated. The routes run in ROUTES_NAMESPACE, one of the pool's
# namespaces: anywhere else the pool's rule refuses such a pod when it is created.

TOLERATE_EVERYTHING = [{"operator": "Exists"}]
# What the cluster's scheduler reports when the allocation policy refuses its write.
ALLOCATION_REFUSAL = "GPU devices are allocated by the scheduler"
ROUTE_SECONDS = 60.0


def _refused_allocation(applied: AppliedStack, namespace: str, pod: str) -> None:
    """The pod went to the cluster's scheduler, whose allocation was refused: it stays
    unbound, holds no GPU, and its FailedScheduling event carries the policy's message."""
    core = _core(applied)

    def refusal() -> Any:
        events = core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod},reason=FailedScheduling"
        ).items
        return [e.message for e in events if ALLOCATION_REFUSAL in (e.message or "")]

    messages = _wait(f"the refused allocation of {pod}", refusal, ROUTE_SECONDS)
    assert applied.outputs["schedulerName"] in messages[0], messages
    stored = core.read_namespaced_pod(pod, namespace)
    assert stored.spec.scheduler_name == DEFAULT_SCHEDULER
    assert not stored.spec.node_name, f"{pod} bound to {stored.spec.node_name}"
    assert [h for h in _held_gpus(applied) if h[0] == namespace] == []


def _gpu_claim_pod(name: str, template: str, **spec: Any) -> dict[str, Any]:
    """A claim pod that tolerates every taint (so pool nodes are open to any scheduler)."""
    pod = _claim_pod(name, template)
    pod["spec"].update({"tolerations": TOLERATE_EVERYTHING, **spec})
    return pod


@pytest.fixture(name="own_gpu_class")
def own_gpu_class_fixture(applied: AppliedStack) -> Iterator[dict[str, str]]:
    """DeviceClasses of other names that select the GPU driver's devices (one with an extended
    resource name), as another chart or an admin could install; removed afterwards."""
    classes = {"plain": "team-gpus.example.com", "extended": "legacy-gpus.example.com"}
    selector = [{"cel": {"expression": f"device.driver == '{dra.DRIVER}'"}}]
    bodies = [
        {
            "apiVersion": dra.RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": classes["plain"]},
            "spec": {"selectors": selector},
        },
        {
            "apiVersion": dra.RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": classes["extended"]},
            "spec": {"selectors": selector, "extendedResourceName": "example.com/gpu"},
        },
    ]
    for body in bodies:
        _resource(applied, "DeviceClass").create(body=body)
    yield classes
    for name in classes.values():
        _resource(applied, "DeviceClass").delete(name=name)


@pytest.fixture(scope="module", name="routes")
def routes_fixture(applied: AppliedStack) -> Iterator[str]:
    """ROUTES_NAMESPACE, for every route (their pods and claims have names of their own)."""
    core = _core(applied)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ROUTES_NAMESPACE)))
    yield ROUTES_NAMESPACE
    core.delete_namespace(ROUTES_NAMESPACE)


def test_a_claim_pod_tolerating_every_taint_is_refused_outside_the_pools_namespaces(
    applied: AppliedStack, namespace: str
) -> None:
    """The first route below, in a namespace that is not the pool's: refused when created,
    naming the scheduler its claims count with."""
    with pytest.raises(client.exceptions.ApiException) as refused:
        _core(applied).create_namespaced_pod(namespace, _gpu_claim_pod("early", "later"))
    message = str(refused.value.body)
    assert "but tolerates the GPU pool's taint" in message, message
    assert applied.outputs["schedulerName"] in message, message


def test_route_a_pod_created_before_its_template_gets_no_gpu(
    applied: AppliedStack, routes: str
) -> None:
    """The claim lookup finds no template, so the pod is admitted unrouted."""
    _core(applied).create_namespaced_pod(routes, _gpu_claim_pod("early", "later"))
    _template(applied, routes, "later", GPU_DEVICE_CLASS, 1)
    _refused_allocation(applied, routes, "early")


def test_route_a_scheduling_gate_held_until_the_template_exists_gets_no_gpu(
    applied: AppliedStack, routes: str
) -> None:
    core = _core(applied)
    gated = _gpu_claim_pod("held", "made-later", schedulingGates=[{"name": "example.com/wait"}])
    core.create_namespaced_pod(routes, gated)
    _template(applied, routes, "made-later", GPU_DEVICE_CLASS, 1)
    core.patch_namespaced_pod("held", routes, {"spec": {"schedulingGates": None}})
    _refused_allocation(applied, routes, "held")


def test_route_another_device_class_of_the_gpu_driver_gets_no_gpu(
    applied: AppliedStack, routes: str, own_gpu_class: dict[str, str]
) -> None:
    """A class the gate does not know selects the GPU driver's devices."""
    _template(applied, routes, "own", own_gpu_class["plain"], 1)
    _core(applied).create_namespaced_pod(routes, _gpu_claim_pod("own-class", "own"))
    _refused_allocation(applied, routes, "own-class")


def test_route_a_device_class_extended_resource_gets_no_gpu(
    applied: AppliedStack, routes: str, own_gpu_class: dict[str, str]
) -> None:
    """`example.com/gpu` is no GPU resource the gate knows; the cluster's scheduler would make
    the claim itself from the class's extended resource name."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy"},
        "spec": {
            "tolerations": TOLERATE_EVERYTHING,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-job:1",
                    "resources": {"limits": {"example.com/gpu": "1"}},
                }
            ],
        },
    }
    _core(applied).create_namespaced_pod(routes, pod)
    _refused_allocation(applied, routes, "legacy")


def test_route_a_claim_swapped_after_admission_gets_no_gpu(
    applied: AppliedStack, routes: str, nic: str
) -> None:
    """The pod names an existing NIC claim (admitted to the cluster's scheduler, held by a
    scheduling gate); the claim is then replaced by a GPU claim of the same name."""
    core, claims = _core(applied), _resource(applied, "ResourceClaim")

    def claim(device_class: str) -> dict[str, Any]:
        spec = dra.claim_template("swapped", device_class)["spec"]["spec"]
        return {
            "apiVersion": dra.RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"name": "swapped"},
            "spec": spec,
        }

    claims.create(body=claim(NIC_CLASS), namespace=routes)
    pod = _gpu_claim_pod("swap", "unused", schedulingGates=[{"name": "example.com/wait"}])
    pod["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimName": "swapped"}]
    core.create_namespaced_pod(routes, pod)
    claims.delete(name="swapped", namespace=routes)
    _wait(
        "the NIC claim gone",
        lambda: all(c.metadata.name != "swapped" for c in claims.get(namespace=routes).items),
    )
    claims.create(body=claim(GPU_DEVICE_CLASS), namespace=routes)
    core.patch_namespaced_pod("swap", routes, {"spec": {"schedulingGates": None}})
    _refused_allocation(applied, routes, "swap")


def test_destroy_removes_what_the_stack_made_and_nothing_else(applied: AppliedStack) -> None:
    """Last: `pulumi destroy` removes every object the stack made, and the nodes are as they
    were."""
    made = applied.kubernetes_objects()
    assert made
    applied.destroy()
    assert [obj for obj in made if applied.exists(obj)] == []
    assert applied.node_state() == applied.nodes_before
