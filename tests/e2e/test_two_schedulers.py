"""Two schedulers, one node: the cluster's kube-scheduler and the stack's, on a GPU node.

Each stack shape (local, dev, prod: each admission engine) applied by the real engine
(module-scoped), its pool's CPU filled with pods bound there until one pool node has room for
one more CPU, the last. Two schedulers that bind
to one node each decide from their own view, and a binding reaches the other's view only
after the API server stored it: the API server accepts every binding of an unbound pod,
whatever the node has left (pkg/registry/core/pod/storage BindingREST.Create checks only that
the pod is unassigned), so both bindings stand and the node's CPU requests exceed its
allocatable. kwok, the simulated kubelet, runs both pods; a real kubelet refuses the one it
admits second (`OutOfcpu`, phase Failed; docs/layers.md, "Two schedulers, one node").

To make the race happen every time it can, the stack's scheduler's bindings in a scenario's
namespace pass through a validating webhook on pods/binding that holds each one until the
scenario releases it (HeldBindings): the time between the scheduler's decision and the moment
another scheduler can see it, stretched. It admits every binding; it changes nothing a
scheduler decides. Each scenario runs in a namespace of admission.poolNamespaces, whose pods may
run on the pool without a GPU (elsewhere the gate keeps them off: test_whole_stack.py).

- test_two_schedulers_both_bind_the_last_cpu_of_a_gpu_node: a DaemonSet's pod (left to the
  cluster's scheduler by the gate) and a GPU pod (the stack's scheduler) both get the last
  CPU: both bindings accepted, the node over its allocatable. This is what remains.
- test_two_schedulers_a_pod_tolerating_the_pool_is_placed_by_the_stacks_scheduler_alone: a
  CPU pod that tolerates the pool's taint and a GPU pod, created at once for the last CPU:
  the gate routes both to the stack's scheduler (a refusing engine refuses them until they
  name it), which binds one and leaves the other Pending. Without the gate's pool rule the
  CPU pod stays with the cluster's scheduler and the node is over-committed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from components.opa_gate.settings import ROUTING_ENGINE
from tools.harness import free_port
from tools.harness.certs import CertificateAuthority, write_private
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack

from .conftest import apply_stack, wait_for

GPU = "nvidia.com/gpu"
DEFAULT_SCHEDULER = "default-scheduler"
LOOPBACK = "127.0.0.1"
# Longer than any scheduling decision here; shorter than the webhook's timeout (30 s at most).
HOLD_SECONDS = 20.0
WAIT_SECONDS = 60.0
# After the last binding: time for a scheduler to act on anything left in its queue.
SETTLE_SECONDS = 5.0
TERMINAL = ("Succeeded", "Failed")
# Each scenario's namespace: one of the pool's (admission.poolNamespaces), where pods that ask
# for no GPU may run on the pool's nodes (its fillers are bound there).
SCENARIO_NAMESPACES = {
    "test_two_schedulers_both_bind_the_last_cpu_of_a_gpu_node": "two-schedulers-race",
    "test_two_schedulers_a_pod_tolerating_the_pool_is_placed_by_the_stacks_scheduler_alone": (
        "two-schedulers-routed"
    ),
}


@pytest.fixture(scope="module", name="applied", params=["local", "dev", "prod"])
def applied_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppliedStack]:
    """Each stack shape, so each engine: routing (local), ValidatingAdmissionPolicy (dev),
    OPA (prod)."""
    stack = str(request.param)
    admission = {
        **stack_config(stack)["admission"],
        "poolNamespaces": sorted(SCENARIO_NAMESPACES.values()),
    }
    yield from apply_stack(
        stack,
        tmp_path_factory.mktemp(f"e2e-two-schedulers-{stack}"),
        overrides={"admission": admission},
    )


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _wait(what: str, check: Callable[[], Any], timeout: float = WAIT_SECONDS) -> Any:
    return wait_for(what, check, timeout)


# ---------------------------------------------------------------------- the pool's CPU


def _cpu_request(pod: Any) -> Decimal:
    """The pod's CPU request as a scheduler counts it (containers, or the largest init one)."""

    def total(containers: Any) -> list[Decimal]:
        return [
            parse_quantity(((c.resources and c.resources.requests) or {}).get("cpu", "0"))
            for c in containers or []
        ]

    return max([sum(total(pod.spec.containers), Decimal(0)), *total(pod.spec.init_containers)])


def _requested(core: Any, node: str) -> Decimal:
    """CPU requested on `node` by the pods bound there that still hold it."""
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sum((_cpu_request(p) for p in pods if p.status.phase not in TERMINAL), Decimal(0))


def _requested_is(core: Any, node: str, want: Decimal) -> Callable[[], bool]:
    return lambda: _requested(core, node) == want


def _allocatable(core: Any, node: str) -> Decimal:
    return parse_quantity(core.read_node(node).status.allocatable["cpu"])


def _fill_the_pool(applied: AppliedStack, core: Any, namespace: str) -> str:
    """Bind a filler pod to every pool node (spec.nodeName: no scheduler involved) so that
    only the first keeps one free CPU; returns that node."""
    target, *others = applied.gpu_nodes
    for node in (target, *others):
        keep = Decimal(1) if node == target else Decimal(0)
        free = _allocatable(core, node) - _requested(core, node) - keep
        if free > 0:
            core.create_namespaced_pod(namespace, _pod(f"filler-{node}", cpu=free, node=node))
    for node in (target, *others):
        want = _allocatable(core, node) - (1 if node == target else 0)
        _wait(f"{node} filled", _requested_is(core, node, want))
    return target


def _pod(
    name: str,
    *,
    cpu: Decimal | int = 1,
    gpus: int = 0,
    node: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as a user writes it: its requests (and a GPU limit), nothing about schedulers."""
    resources: dict[str, Any] = {"requests": {"cpu": str(cpu)}}
    if gpus:
        resources["limits"] = {GPU: str(gpus), "cpu": str(cpu)}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/job:1", "resources": resources}]
    }
    if node is not None:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _create(applied: AppliedStack, core: Any, namespace: str, manifest: dict[str, Any]) -> Any:
    """The pod created as its user would: as written; where the engine refuses it for naming
    no scheduler (a GPU pod, a pool pod), again with the scheduler the refusal names."""
    try:
        return core.create_namespaced_pod(namespace, manifest)
    except ApiException as exc:
        if applied.outputs["admissionEngine"] == ROUTING_ENGINE:
            raise
        message = json.loads(exc.body or "{}").get("message", "")
        scheduler = applied.outputs["schedulerName"]
        assert f"must set spec.schedulerName: {scheduler}" in message, message
        named = {**manifest, "spec": {**manifest["spec"], "schedulerName": scheduler}}
        return core.create_namespaced_pod(namespace, named)


def _pool_toleration(applied: AppliedStack) -> dict[str, Any]:
    """A toleration naming the pool taint's key, as a user writes one."""
    return {"key": applied.outputs["gpuTaint"]["key"], "operator": "Exists"}


# ---------------------------------------------------------------------- held bindings


def _stack_scheduler_user(applied: AppliedStack, core: Any) -> str:
    """The user the stack's scheduler binds pods as: its pods' ServiceAccount."""
    assert applied.runtime is not None
    (user,) = {
        f"system:serviceaccount:{p.namespace}:"
        + core.read_namespaced_pod(p.name, p.namespace).spec.service_account_name
        for p in applied.runtime.processes.values()
        if "kube-scheduler" in p.process.argv[0]
    }
    return user


class HeldBindings:
    """A validating admission webhook on pods/binding, for `binder`'s bindings in `namespace`
    only, that holds each one back until release() (or HOLD_SECONDS), then admits it.

    A dry-run binding is answered at once and marks the webhook as in force. The webhook
    admits every request: it only widens the window between a scheduler's decision and the
    moment the API server stores it, which is where the other scheduler's view is stale.
    """

    def __init__(self, api_client: Any, namespace: str, binder: str, workdir: Path) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.binder = binder
        self.workdir = workdir
        self.name = f"held-bindings-{uuid.uuid4().hex[:6]}"
        self.held: list[str] = []
        """Names of the pods whose bindings arrived, in order."""
        self._arrived = threading.Condition()
        self._released = threading.Event()
        self._probed = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> HeldBindings:
        ca = CertificateAuthority("gpu-cluster held-bindings CA")
        serving = ca.issue("held-bindings", ip_addresses=[LOOPBACK], server=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert = self.workdir / "tls.crt"
        cert.write_bytes(serving.cert_pem)
        key = write_private(self.workdir / "tls.key", serving.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        port = free_port()
        self._server = ThreadingHTTPServer((LOOPBACK, port), self._handler())
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        admission: Any = client.AdmissionregistrationV1Api(self.api_client)
        admission.create_validating_webhook_configuration(
            self._configuration(f"https://{LOOPBACK}:{port}/", ca.cert_pem)
        )
        self._wait_in_force()
        return self

    def __exit__(self, *_: object) -> None:
        self._released.set()
        admission: Any = client.AdmissionregistrationV1Api(self.api_client)
        with contextlib.suppress(client.exceptions.ApiException):
            admission.delete_validating_webhook_configuration(self.name)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _configuration(self, url: str, ca_pem: bytes) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": "held-bindings.e2e.gpu-cluster.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 30,
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods/binding"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "matchConditions": [
                        {
                            "name": "binder",
                            "expression": f"request.userInfo.username == {json.dumps(self.binder)}",
                        }
                    ],
                    "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                }
            ],
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        held = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                if request.get("dryRun"):
                    held._probed.set()
                else:
                    with held._arrived:
                        held.held.append(request["name"])
                        held._arrived.notify_all()
                    held._released.wait(HOLD_SECONDS)
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": request["uid"], "allowed": True},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler

    def _wait_in_force(self) -> None:
        """A dry-run binding by `binder` of an unbound pod reaches the webhook."""
        core: Any = client.CoreV1Api(self.api_client)
        probe = f"probe-{uuid.uuid4().hex[:6]}"
        # On a scheduler nobody runs: nothing binds it.
        manifest = _pod(probe, cpu=0)
        manifest["spec"]["schedulerName"] = "no-scheduler"
        core.create_namespaced_pod(self.namespace, manifest)
        binder = client.ApiClient(self.api_client.configuration)
        binder.set_default_header("Impersonate-User", self.binder)
        binder.set_default_header("Impersonate-Group", "system:serviceaccounts")
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=probe),
            target=client.V1ObjectReference(kind="Node", name="no-node"),
        )
        try:

            def probed() -> bool:
                client.CoreV1Api(binder).create_namespaced_pod_binding(
                    probe, self.namespace, binding, dry_run="All", _preload_content=False
                )
                return self._probed.wait(0.5)

            _wait("the held-bindings webhook in force", probed)
        finally:
            binder.close()
            core.delete_namespaced_pod(probe, self.namespace, grace_period_seconds=0)

    def wait_held(self, timeout: float = WAIT_SECONDS) -> str | None:
        """The first pod whose binding is held, once one is; None if none comes in time."""
        with self._arrived:
            self._arrived.wait_for(lambda: bool(self.held), timeout)
            return self.held[0] if self.held else None

    def release(self) -> None:
        self._released.set()


# ---------------------------------------------------------------------- the scenarios


@pytest.fixture(name="scenario")
def scenario_fixture(applied: AppliedStack, request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's namespace (SCENARIO_NAMESPACES); afterwards its pods are gone before the
    next one computes the pool's room, and the namespace is deleted."""
    core = _core(applied)
    name = SCENARIO_NAMESPACES[request.node.originalname]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    apps: Any = client.AppsV1Api(applied.api_client())
    for daemon_set in apps.list_namespaced_daemon_set(name).items:
        apps.delete_namespaced_daemon_set(daemon_set.metadata.name, name)
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    _wait(f"the pods of {name} gone", lambda: not core.list_namespaced_pod(name).items)
    core.delete_namespace(name)


def _events(core: Any, namespace: str, name: str, reason: str) -> list[Any]:
    return list(
        core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},reason={reason}"
        ).items
    )


def _reporters(events: list[Any]) -> set[str]:
    return {e.reporting_component or (e.source.component if e.source else "") for e in events}


def _met_a_scheduler(core: Any, namespace: str, name: str) -> Callable[[], bool]:
    """Whether the pod is bound, or a scheduler has found no room for it."""

    def met() -> bool:
        pod = core.read_namespaced_pod(name, namespace)
        return bool(pod.spec.node_name or _events(core, namespace, name, "FailedScheduling"))

    return met


def test_two_schedulers_both_bind_the_last_cpu_of_a_gpu_node(
    applied: AppliedStack, scenario: str, tmp_path: Path
) -> None:
    """What remains: a DaemonSet's pod that tolerates the pool's taint is left to the
    cluster's scheduler. The stack's scheduler has given a GPU pod the pool's last CPU and its
    binding is on its way; the cluster's scheduler, which cannot see it yet, gives the same
    CPU to the DaemonSet's pod. The API server accepts both bindings."""
    core = _core(applied)
    apps: Any = client.AppsV1Api(applied.api_client())
    stack_scheduler = applied.outputs["schedulerName"]
    target = _fill_the_pool(applied, core, scenario)
    binder = _stack_scheduler_user(applied, core)
    with HeldBindings(applied.api_client(), scenario, binder, tmp_path / "webhook") as held:
        _create(applied, core, scenario, _pod("train", gpus=1))
        assert held.wait_held() == "train", "the stack's scheduler placed no GPU pod"
        template = _pod("agent", tolerations=[_pool_toleration(applied)])
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": target}
        selector = {"app": "agent"}
        apps.create_namespaced_daemon_set(
            scenario,
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "agent"},
                "spec": {
                    "selector": {"matchLabels": selector},
                    "template": {"metadata": {"labels": selector}, "spec": template["spec"]},
                },
            },
        )
        (agent,) = _wait(
            "the DaemonSet's pod bound",
            lambda: [
                p
                for p in core.list_namespaced_pod(scenario, label_selector="app=agent").items
                if p.spec.node_name
            ],
        )
        held.release()
    train = _wait(
        "the GPU pod bound",
        lambda: (p := core.read_namespaced_pod("train", scenario)).spec.node_name and p,
    )
    name = agent.metadata.name
    assert agent.spec.scheduler_name == DEFAULT_SCHEDULER
    assert _reporters(_events(core, scenario, name, "Scheduled")) == {DEFAULT_SCHEDULER}
    assert train.spec.scheduler_name == stack_scheduler
    assert _reporters(_events(core, scenario, "train", "Scheduled")) == {stack_scheduler}
    assert (agent.spec.node_name, train.spec.node_name) == (target, target)
    # Both bindings accepted: the node's CPU requests exceed what it can allocate.
    assert _requested(core, target) == _allocatable(core, target) + 1


def test_two_schedulers_a_pod_tolerating_the_pool_is_placed_by_the_stacks_scheduler_alone(
    applied: AppliedStack, scenario: str, tmp_path: Path
) -> None:
    """A CPU pod that selects and tolerates the pool, and a GPU pod, created at once for the
    pool's last CPU, neither naming a scheduler: both are routed to the stack's scheduler (a
    refusing engine refuses both, naming it, and the user names it), which counts the binding
    it has on its way and leaves the other pod Pending."""
    core = _core(applied)
    stack_scheduler = applied.outputs["schedulerName"]
    target = _fill_the_pool(applied, core, scenario)
    binder = _stack_scheduler_user(applied, core)
    prep = _pod(
        "prep",
        tolerations=[_pool_toleration(applied)],
        node_selector=applied.outputs["gpuNodeLabels"],
    )
    with HeldBindings(applied.api_client(), scenario, binder, tmp_path / "webhook") as held:
        created = {
            "train": _create(applied, core, scenario, _pod("train", gpus=1)),
            "prep": _create(applied, core, scenario, prep),
        }
        first = held.wait_held()
        # While that binding is held, the other pod meets a scheduler too.
        for name in set(created) - {first}:
            _wait(f"{name} bound or refused", _met_a_scheduler(core, scenario, name))
        held.release()
    if first is not None:
        _wait(
            f"the held binding of {first} done",
            lambda: core.read_namespaced_pod(first, scenario).spec.node_name,
        )
    time.sleep(SETTLE_SECONDS)
    pods = {name: core.read_namespaced_pod(name, scenario) for name in created}
    facts = {
        name: (pod.spec.scheduler_name, pod.spec.node_name, pod.status.phase)
        for name, pod in pods.items()
    }
    over = _requested(core, target) - _allocatable(core, target)
    assert over <= 0, f"{target} over-committed by {over} CPU: {facts}"
    assert {p.spec.scheduler_name for p in created.values()} == {stack_scheduler}, facts
    bound = sorted(name for name, pod in pods.items() if pod.spec.node_name)
    assert len(bound) == 1 and pods[bound[0]].spec.node_name == target, facts
    (pending,) = set(pods) - set(bound)
    assert pods[pending].status.phase == "Pending", facts
    assert _reporters(_events(core, scenario, pending, "FailedScheduling")) == {stack_scheduler}
