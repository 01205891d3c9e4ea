"""The allocation policy (DRA mode) on a real kube-apiserver: only the stack's scheduler writes
an allocation of a GPU driver's devices, whoever else tries and whatever the claim looks like.

Each row creates a ResourceClaim, then writes its status (resourceclaims/status, as
kube-scheduler's DynamicResources plugin does in PreBind) as one identity, impersonated by the
admin with the group system:masters so that RBAC lets every write through and the verdict is
the policy's alone. The policy is OpaGate's, built by components/opa_gate/manifests.py for the
stack's scheduler. The routes that lead a pod to another scheduler, with real schedulers:
tests/e2e/test_dra.py. (The API server's type checker does not resolve a rule on a
subresource and leaves this policy's status empty: the verdicts below are its check.)
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from components.gpu_resources import DRA_DRIVER
from components.kubernetes_names import service_account_user
from components.opa_gate.manifests import (
    ALLOCATION_POLICY,
    allocation_objects,
)
from tests.integration.conftest import require_tools
from tests.integration.gate_live import wait_for
from tools.harness import LocalControlPlane
from tools.harness.child_process import no_proxy_opener

pytestmark = pytest.mark.integration

SCHEDULER = "gpu-binpack-scheduler"
STACK_SCHEDULER = service_account_user("kube-system", SCHEDULER)
CLUSTER_SCHEDULER = "system:kube-scheduler"
CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
ADMIN = "kubernetes-admin"
DRIVER_PLUGIN = "system:node:gpu-node-1"
GATE_NAMESPACE = "gpu-admission"
OPERATOR_NAMESPACE = "gpu-operator"
TEAM = "team-a"
# Admin access is allowed only in namespaces labelled so (the API server's DRA admission).
MONITORING = "monitoring"
ADMIN_ACCESS_LABEL = {"resource.kubernetes.io/admin-access": "true"}
NIC_DRIVER = "nic.example.com"
API = "/apis/admissionregistration.k8s.io/v1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


@dataclass(frozen=True)
class Device:
    """One allocated device: the result of a request."""

    driver: str = DRA_DRIVER
    device: str = "gpu-0"
    admin_access: bool = False
    request: str = "gpu"

    def result(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": "gpu-node-1",
            "device": self.device,
        }
        if self.admin_access:
            found["adminAccess"] = True
        return found


@dataclass(frozen=True)
class Row:
    """A write of a claim's status by `writer`; `before` allocates it first (as the stack's
    scheduler), so the write changes something else."""

    name: str
    writer: str
    devices: Sequence[Device] = (Device(),)
    namespace: str = TEAM
    refused: bool = False
    before: bool = False
    change: Mapping[str, Any] = field(default_factory=dict)


ROWS = (
    Row("cluster-scheduler-takes-a-gpu", CLUSTER_SCHEDULER, refused=True),
    Row("stack-scheduler-takes-a-gpu", STACK_SCHEDULER),
    Row("cluster-admin-takes-a-gpu", ADMIN, refused=True),
    Row(
        "cluster-scheduler-takes-a-mig-device",
        CLUSTER_SCHEDULER,
        (Device(device="mig-1g-10gb-0"),),
        refused=True,
    ),
    Row(
        "cluster-scheduler-takes-a-nic",
        CLUSTER_SCHEDULER,
        (Device(driver=NIC_DRIVER, device="nic-0", request="nic"),),
    ),
    Row(
        "cluster-scheduler-takes-a-nic-and-a-gpu",
        CLUSTER_SCHEDULER,
        (Device(driver=NIC_DRIVER, device="nic-0", request="nic"), Device()),
        refused=True,
    ),
    Row(
        "stack-scheduler-takes-a-nic-and-a-gpu",
        STACK_SCHEDULER,
        (Device(driver=NIC_DRIVER, device="nic-0", request="nic"), Device()),
    ),
    Row(
        "cluster-scheduler-admin-access-for-monitoring",
        CLUSTER_SCHEDULER,
        (Device(admin_access=True),),
        namespace=MONITORING,
    ),
    Row(
        "cluster-scheduler-in-the-operators-namespace",
        CLUSTER_SCHEDULER,
        namespace=OPERATOR_NAMESPACE,
    ),
    Row("controller-deallocates", CONTROLLER, before=True, change={"allocation": None}),
    Row(
        "driver-reports-device-status",
        DRIVER_PLUGIN,
        before=True,
        change={"devices": [{"driver": DRA_DRIVER, "pool": "gpu-node-1", "device": "gpu-0"}]},
    ),
)


def _claim_spec(devices: Sequence[Device]) -> dict[str, Any]:
    requests = []
    for device in devices:
        exactly: dict[str, Any] = {"deviceClassName": f"{device.driver}-class"}
        if device.admin_access:
            exactly["adminAccess"] = True
        requests.append({"name": device.request, "exactly": exactly})
    return {"devices": {"requests": requests}}


def _allocation(devices: Sequence[Device]) -> dict[str, Any]:
    return {"devices": {"results": [d.result() for d in devices]}}


def _as(cp: LocalControlPlane, user: str, method: str, path: str, body: Any) -> tuple[int, str]:
    """(HTTP status, Status.message) of `method path` sent as `user`, impersonated with the
    group system:masters (RBAC allows it; admission alone decides)."""
    request = urllib.request.Request(
        f"{cp.server}{path}", data=json.dumps(body).encode(), method=method
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    request.add_header("Impersonate-User", user)
    request.add_header("Impersonate-Group", "system:masters")
    try:
        with no_proxy_opener(cp.ssl_context()).open(request, timeout=10) as response:
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalControlPlane]:
    require_tools("etcd", "kube-apiserver")
    with LocalControlPlane(base_dir=tmp_path_factory.mktemp("allocations")) as started:
        for namespace, labels in (
            (GATE_NAMESPACE, {}),
            (OPERATOR_NAMESPACE, {}),
            (TEAM, {}),
            (MONITORING, ADMIN_ACCESS_LABEL),
        ):
            started.request(
                "POST", "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": labels}}
            )
        yield started


def _claim(cp: LocalControlPlane, namespace: str, devices: Sequence[Device]) -> dict[str, Any]:
    body = {"metadata": {"name": f"claim-{uuid.uuid4().hex[:8]}"}, "spec": _claim_spec(devices)}
    created: dict[str, Any] = cp.request("POST", CLAIMS.format(namespace=namespace), body)
    return created


def _write_status(
    cp: LocalControlPlane, user: str, claim: dict[str, Any], status: Mapping[str, Any]
) -> tuple[int, str]:
    path = f"{CLAIMS.format(namespace=claim['metadata']['namespace'])}/{claim['metadata']['name']}"
    return _as(cp, user, "PUT", f"{path}/status", {**claim, "status": dict(status)})


def _allocated_by_the_stack(cp: LocalControlPlane, row: Row) -> dict[str, Any]:
    claim = _claim(cp, row.namespace, row.devices)
    status, message = _write_status(
        cp, STACK_SCHEDULER, claim, {"allocation": _allocation(row.devices)}
    )
    assert status == 200, message
    path = f"{CLAIMS.format(namespace=row.namespace)}/{claim['metadata']['name']}"
    stored: dict[str, Any] = cp.request("GET", path)
    return stored


def _outcome(cp: LocalControlPlane, row: Row) -> tuple[int, str]:
    if row.before:
        claim = _allocated_by_the_stack(cp, row)
        status = {
            k: v for k, v in {**claim.get("status", {}), **row.change}.items() if v is not None
        }
        return _write_status(cp, row.writer, claim, status)
    claim = _claim(cp, row.namespace, row.devices)
    return _write_status(cp, row.writer, claim, {"allocation": _allocation(row.devices)})


@contextlib.contextmanager
def _policy(cp: LocalControlPlane, *, in_force: bool = True) -> Iterator[None]:
    """The allocation policy and its binding, as OpaGate declares them for the stack's
    scheduler; in force when yielded (a cluster scheduler's GPU allocation refused)."""
    objects = allocation_objects(
        allocator=STACK_SCHEDULER,
        scheduler_name=SCHEDULER,
        drivers=[DRA_DRIVER],
        gate_namespace=GATE_NAMESPACE,
        operator_namespace=OPERATOR_NAMESPACE,
    )
    made = []
    probe = Row("probe", CLUSTER_SCHEDULER)
    last: list[tuple[int, str]] = []
    try:
        for collection, name, spec in objects:
            body = {"metadata": {"name": name}, "spec": spec}
            cp.request("POST", f"{API}/{collection}", body)
            made.append(f"{API}/{collection}/{name}")
        if in_force:

            def refused() -> bool:
                last[:] = [_outcome(cp, probe)]
                return last[0][0] == 403

            wait_for("the allocation policy in force", refused, lambda: repr(last))
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(urllib.error.HTTPError):
                cp.request("DELETE", path)

    def forgotten() -> bool:
        last[:] = [_outcome(cp, probe)]
        return last[0][0] == 200

    wait_for("the allocation policy removed", forgotten, lambda: repr(last))


def test_allocations_live_only_the_stack_scheduler_allocates_gpus(
    control_plane: LocalControlPlane,
) -> None:
    wrong = []
    with _policy(control_plane):
        for row in ROWS:
            status, message = _outcome(control_plane, row)
            if row.refused and status != 403:
                wrong.append(f"{row.name}: {status}, expected the policy's refusal")
            elif not row.refused and status != 200:
                wrong.append(f"{row.name}: {status} {message}")
            elif row.refused and ALLOCATION_POLICY not in message:
                wrong.append(f"{row.name}: refused, but not by {ALLOCATION_POLICY}: {message}")
    assert not wrong, "\n".join(wrong)


def test_allocations_live_refusal_names_the_device_the_writer_and_what_to_do(
    control_plane: LocalControlPlane,
) -> None:
    with _policy(control_plane):
        claim = _claim(control_plane, TEAM, [Device(device="gpu-3")])
        status, message = _write_status(
            control_plane,
            CLUSTER_SCHEDULER,
            claim,
            {"allocation": _allocation([Device(device="gpu-3")])},
        )
    assert status == 403
    assert message.endswith(
        f"ResourceClaim {TEAM}/{claim['metadata']['name']} would get {DRA_DRIVER} device "
        f"gpu-node-1/gpu-3 from {CLUSTER_SCHEDULER}; GPU devices are allocated by the scheduler "
        f"{SCHEDULER} alone: delete the pod and create it again, once its ResourceClaimTemplate "
        f"or ResourceClaim exists, with spec.schedulerName unset or {SCHEDULER}"
    ), message


def test_allocations_live_without_the_policy_any_scheduler_allocates_gpus(
    control_plane: LocalControlPlane,
) -> None:
    """What the policy closes: without it the API server lets any writer allocate a GPU."""
    status, message = _outcome(control_plane, Row("unguarded", CLUSTER_SCHEDULER))
    assert status == 200, message
