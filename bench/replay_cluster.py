"""The live replay: a harness control plane holding the trace's nodes, the profiles under test.

`ReplayCluster` starts etcd and kube-apiserver, creates the nodes (the bare trace or the
realistic fleet of bench/fleet.py) and, per `run`, creates the pods, starts kube-scheduler with
one profile and follows its decisions until every pod is bound or Unschedulable. Pods naming a
job (bench.derive_trace --jobs) are the members of a PodGroup (scheduling.k8s.io/v1beta1, gang
policy, minCount its workers in the run), created before its pods; the API server then serves
PodGroups (the stack's GANG_APISERVER_FLAGS) and the gang profiles run the scheduler with
gangs on (scheduler.gangScheduling). Profiles without gangs ignore the groups: their
scheduler runs without the GenericWorkload gate. A rejected gang's members are each marked
Unschedulable with the group's message (schedule_one_podgroup.go,
submitPodGroupAlgorithmResult), so a run ends as it does without gangs. A run is three
steps: `render` (the scheduler's configuration and the pod objects, no cluster), the live part
(`ReplayCluster._schedule`: pods created, the scheduler started, its decisions followed into an
`Outcome`) and `measure` (the `Metrics` of that outcome, no cluster).

With `dra` the GPUs go through Dynamic Resource Allocation (bench/dra.py): each node's GPUs are
the devices of its ResourceSlice (none in its allocatable), each GPU pod claims them from the
template of its GPU count, and kube-controller-manager's resourceclaim controller, running for
the cluster's life, makes the claims; a run starts its scheduler once every pod's claims are
made, and ends with the claims deleted beside the pods.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import yaml

from bench import dra as dra_objects
from bench import fleet
from bench.openb_trace import TraceNode, TracePod, jobs_of
from bench.replay_results import (
    ALGORITHM_METRIC,
    GPU,
    GROUP_ATTEMPT_METRIC,
    Metrics,
    attempt_mean,
    attempt_quantile,
    compute_job_metrics,
    compute_metrics,
    observations,
)
from components.binpack_scheduler.manifests import feature_gates_flag, render_config
from components.binpack_scheduler.settings import (
    FRAGMENTATION,
    GANG_GROUP_VERSION,
    GANG_RESOURCE,
)
from components.tainted_gpu_pool.settings import Taint
from stack_config import SchedulerConfig

if TYPE_CHECKING:
    from tools.harness import ManagedProcess

NODE_PODS = 110
NAMESPACE = "openb"
FLEETS = ("bare", "realistic")
PROFILES = ("default", "mostallocated", "binpack", "fragmentation")
GANG_PROFILES = ("binpack-gangs", "fragmentation-gangs")
"""binpack and fragmentation with scheduler.gangScheduling (for a trace with jobs)."""
ALL_PROFILES = (*PROFILES, *GANG_PROFILES)
# The Kubernetes documentation's bin-packing example ("Resource Bin Packing"): MostAllocated,
# cpu and memory weight 1, the extended resource 3.
MOST_ALLOCATED_WEIGHTS = {"cpu": 1, "memory": 1, GPU: 3}
POOL_TAINT = Taint()
TRACE_IMAGE = "registry.invalid/trace:1"
CLIENT_QPS = 5000
# kube-scheduler v1.37 fills its informers with a streaming watch (the WatchListClient
# feature), whose initial events did not come in name order here (288 of 300 first attempts
# out of trace order in a 300-pod run); a plain LIST returns the pods sorted by name.
SCHEDULER_GATES = {"WatchListClient": False}
SCHEDULER_FLAGS = tuple(feature_gates_flag(SCHEDULER_GATES))
# The built tool each profile runs: the fragmentation profiles need the GpuFragmentation plugin
# (scheduler/, built by tools/build-tools.sh); the image only satisfies the settings' check.
BINARIES = {
    "fragmentation": "gpu-binpack-scheduler",
    "fragmentation-gangs": "gpu-binpack-scheduler",
}
BENCH_IMAGE = "localhost/gpu-binpack-scheduler:bench"
# The stack's scheduler settings each of its profiles renders when the caller gives none.
STACK_SETTINGS: dict[str, Callable[[], SchedulerConfig]] = {
    "binpack": SchedulerConfig,
    "fragmentation": lambda: SchedulerConfig(scoring=FRAGMENTATION, image=BENCH_IMAGE),
    "binpack-gangs": lambda: SchedulerConfig(gang_scheduling=True),
    "fragmentation-gangs": lambda: SchedulerConfig(
        scoring=FRAGMENTATION, image=BENCH_IMAGE, gang_scheduling=True
    ),
}
PODGROUPS = f"/apis/{GANG_GROUP_VERSION}/namespaces/{NAMESPACE}/{GANG_RESOURCE}"
ATTEMPT = re.compile(r'"Attempting to schedule pod" pod="' + NAMESPACE + r"/p(\d+)-")


# ------------------------------------------------------------------- cluster objects


def scheduler_config(
    profile: str,
    kubeconfig: str,
    settings: SchedulerConfig | None = None,
    *,
    score_all: bool = True,
) -> tuple[str, dict[str, Any]]:
    """(schedulerName, KubeSchedulerConfiguration) for `profile`.

    binpack is rendered from `settings` (default: the stack's default scheduler settings),
    scoring every node unless the settings choose a percentageOfNodesToScore; fragmentation is
    the same with `scheduler.scoring: fragmentation` (the GpuFragmentation plugin); default
    scores every node. With `score_all` false every profile keeps kube-scheduler's adaptive
    sample (what the stack's own settings do).
    """
    if profile in STACK_SETTINGS:
        stack_profile = (settings or STACK_SETTINGS[profile]()).profile
        if settings is None and score_all:  # the stack's settings leave sampling adaptive
            stack_profile = replace(stack_profile, percentage_of_nodes_to_score=100)
        stack_profile = replace(stack_profile, leader_elect=False)
        config = render_config(stack_profile, kubeconfig=kubeconfig)
        name = stack_profile.scheduler_name
    elif profile in ("default", "mostallocated"):
        name = "default-scheduler"
        stock: dict[str, Any] = {"schedulerName": name}
        if score_all:
            stock["percentageOfNodesToScore"] = 100
        if profile == "mostallocated":
            stock["pluginConfig"] = [most_allocated_args()]
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": kubeconfig},
            "profiles": [stock],
        }
    else:
        raise ValueError(f"profile {profile!r}: expected one of {', '.join(ALL_PROFILES)}")
    # Same client rate for both: the replay measures scoring, not client-side throttling.
    config["clientConnection"].update(qps=CLIENT_QPS, burst=CLIENT_QPS)
    return name, config


def scheduler_flags(profile: str, settings: SchedulerConfig | None = None) -> tuple[str, ...]:
    """The feature gates the scheduler of `profile` runs with: the stack's settings' own
    (GenericWorkload with gangs) beside SCHEDULER_GATES, in one --feature-gates flag."""
    gates = dict(SCHEDULER_GATES)
    if profile in STACK_SETTINGS:
        gates |= (settings or STACK_SETTINGS[profile]()).profile.feature_gates
    return tuple(feature_gates_flag(gates))


def most_allocated_args() -> dict[str, Any]:
    """NodeResourcesFit scoring by MostAllocated over `MOST_ALLOCATED_WEIGHTS`."""
    return {
        "name": "NodeResourcesFit",
        "args": {
            "scoringStrategy": {
                "type": "MostAllocated",
                "resources": [
                    {"name": name, "weight": weight}
                    for name, weight in MOST_ALLOCATED_WEIGHTS.items()
                ],
            }
        },
    }


def pod_name(index: int, pod: TracePod) -> str:
    return f"p{index:05d}-{pod.name}"


def node_capacity(node: TraceNode) -> dict[str, str]:
    return {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        GPU: str(node.gpus),
        "pods": str(NODE_PODS),
    }


def podgroup_object(job: str, workers: int) -> dict[str, Any]:
    """The PodGroup of a job: a gang of all its `workers`."""
    return {
        "apiVersion": GANG_GROUP_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": job, "labels": {"trace": "openb"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": workers}}},
    }


def pod_object(
    index: int, pod: TracePod, scheduler_name: str, image: str = TRACE_IMAGE
) -> dict[str, Any]:
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits = {}
    if pod.gpus:
        # Extended resources cannot be overcommitted: limits must equal requests.
        requests[GPU] = limits[GPU] = str(pod.gpus)
    group = {"schedulingGroup": {"podGroupName": pod.job}} if pod.job else {}
    return {
        "metadata": {"name": pod_name(index, pod), "labels": {"trace": "openb"}},
        "spec": {
            **group,
            "schedulerName": scheduler_name,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [POOL_TAINT.toleration()],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


def decision(pod: Mapping[str, Any]) -> tuple[bool, str | None, str]:
    """(decided, node, message) for a pod object.

    Bound: (True, node, ""). Marked Unschedulable: (True, None, the condition's message).
    """
    node = pod.get("spec", {}).get("nodeName")
    if node:
        return True, str(node), ""
    for cond in pod.get("status", {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return True, None, str(cond.get("message", ""))
    return False, None, ""


def out_of_order_attempts(first_attempts: Sequence[int]) -> int:
    """How many first attempts came after a later trace pod's first attempt."""
    highest = -1
    late = 0
    for index in first_attempts:
        if index < highest:
            late += 1
        highest = max(highest, index)
    return late


def first_attempts(log: str) -> list[int]:
    """Trace positions in the order of their first "Attempting to schedule pod" log line."""
    seen: set[int] = set()
    order = []
    for match in ATTEMPT.finditer(log):
        index = int(match.group(1))
        if index not in seen:
            seen.add(index)
            order.append(index)
    return order


@dataclass(frozen=True, kw_only=True)
class Rendered:
    """One run's inputs as the API server and the scheduler take them."""

    profile: str
    config: dict[str, Any]
    """The KubeSchedulerConfiguration."""
    pods: tuple[dict[str, Any], ...]
    """The pod objects in arrival order, named so that name order is arrival order."""
    groups: tuple[dict[str, Any], ...] = ()
    """The PodGroups of the pods' jobs, created before the pods."""
    templates: tuple[dict[str, Any], ...] = ()
    """The ResourceClaimTemplates the pods claim their GPUs from (DRA; none otherwise)."""
    flags: tuple[str, ...] = SCHEDULER_FLAGS
    """The scheduler's command-line flags besides its configuration and log level."""


def render(
    profile: str,
    pods: Sequence[TracePod],
    kubeconfig: str,
    *,
    settings: SchedulerConfig | None = None,
    score_all: bool = True,
    image: Callable[[TracePod], str] = lambda _: TRACE_IMAGE,
    dra: bool = False,
) -> Rendered:
    """The scheduler's configuration for `profile` and the pods, each asking for that scheduler.

    `settings` and `score_all` as `scheduler_config` takes them; `image(pod)` is the pod's image.
    With `dra` the GPU pods claim their GPUs from the claim templates (bench/dra.py).
    """
    scheduler_name, config = scheduler_config(profile, kubeconfig, settings, score_all=score_all)
    objects = tuple(
        pod_object(index, pod, scheduler_name, image(pod)) for index, pod in enumerate(pods)
    )
    templates: tuple[dict[str, Any], ...] = ()
    if dra:
        objects = tuple(
            dra_objects.claim_pod(obj, pod.gpus) for obj, pod in zip(objects, pods, strict=True)
        )
        templates = tuple(dra_objects.claim_templates(pod.gpus for pod in pods))
    groups = tuple(podgroup_object(job, len(members)) for job, members in jobs_of(pods).items())
    return Rendered(
        profile=profile,
        config=config,
        pods=objects,
        groups=groups,
        templates=templates,
        flags=scheduler_flags(profile, settings),
    )


class Decisions:
    """Where each pod of a run went, from the pod objects a list and watch return."""

    def __init__(self, names: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        self._index = {name: index for index, name in enumerate(names)}
        self._decided = [False] * len(names)
        self._clock = clock
        self.placed: list[str | None] = [None] * len(names)
        """Each pod's node; None while it is pending or after it was rejected."""
        self.messages = [""] * len(names)
        """Each rejected pod's Unschedulable message."""
        self.decided_at: list[float] = []
        """When each pod was first seen decided, in the order they were."""
        self.bound_order: list[int] = []
        """Pods' positions in the order they were first seen bound."""
        self.remaining = len(names)

    def see(self, obj: Mapping[str, Any]) -> bool:
        """Record `obj` (a pod of the run or not); True once every pod of the run is decided."""
        index = self._index.get(obj["metadata"]["name"])
        if index is None:
            return False
        is_decided, node, message = decision(obj)
        if is_decided:
            if not self._decided[index]:
                self._decided[index] = True
                self.remaining -= 1
                self.decided_at.append(self._clock())
            if node and self.placed[index] is None:
                self.bound_order.append(index)
            self.placed[index] = node or self.placed[index]
            self.messages[index] = message or self.messages[index]
        return self.remaining == 0

    def scheduling_s(self) -> float | None:
        """From the first pod decided to the last; None with fewer than two."""
        if len(self.decided_at) < 2:
            return None
        return self.decided_at[-1] - self.decided_at[0]


@dataclass(frozen=True, kw_only=True)
class JobTiming:
    """One job submitted to an idle scheduler (`ReplayCluster.time_job`)."""

    profile: str
    nodes: int
    fleet: str
    workers: int
    bound: int
    """Workers bound (the others were rejected)."""
    wall_s: float
    """From creating the PodGroup until the last worker was decided."""
    group_cycle_s: float | None
    """The scheduler's pod group cycle latency for the job (None: no pod group cycle ran,
    a scheduler without gangs)."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one run observed."""

    placed: tuple[str | None, ...]
    messages: tuple[str, ...]
    wall_s: float
    """From starting the scheduler until every pod was decided."""
    scheduling_s: float | None
    attempts: tuple[int, ...]
    """Trace positions in the order of their first scheduling attempt (the scheduler's log)."""
    exposition: str
    """The scheduler's /metrics at the end."""
    bound_order: tuple[int, ...] = ()
    """Pods' positions in the order they were seen bound."""


def measure(
    rendered: Rendered,
    pods: Sequence[TracePod],
    view: Sequence[TraceNode],
    fleet_kind: str,
    outcome: Outcome,
) -> Metrics:
    """The run's metrics; `view` is the nodes as the scheduler saw them (`ReplayCluster.view`)."""
    late = out_of_order_attempts(outcome.attempts) if len(outcome.attempts) == len(pods) else None
    metrics = compute_metrics(
        rendered.profile,
        view,
        pods,
        outcome.placed,
        outcome.wall_s,
        late,
        outcome.messages,
        split_by_placement=bool(rendered.templates),
    )
    jobs = None
    if rendered.groups:
        jobs = compute_job_metrics(view, pods, outcome.placed, outcome.bound_order)
    return replace(
        metrics,
        jobs=jobs,
        group_attempt_p99_s=attempt_quantile(outcome.exposition, 0.99, GROUP_ATTEMPT_METRIC),
        group_attempts=observations(outcome.exposition, GROUP_ATTEMPT_METRIC),
        percentage_of_nodes_to_score=rendered.config["profiles"][0].get("percentageOfNodesToScore"),
        fleet=fleet_kind,
        scheduling_s=outcome.scheduling_s,
        attempt_p99_s=attempt_quantile(outcome.exposition, 0.99),
        attempt_mean_s=attempt_mean(outcome.exposition),
        algorithm_p99_s=attempt_quantile(outcome.exposition, 0.99, ALGORITHM_METRIC),
    )


# ------------------------------------------------------------------------ live replay


class _Api:
    """JSON over keep-alive HTTPS connections, one per thread (the admin credentials)."""

    def __init__(self, server: str, context: Any) -> None:
        url = urlparse(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = context
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        for attempt in range(3):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {raw[:500]!r}")
            return json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def watch(
        self, path: str, resource_version: str, on_object: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """Feed watch events' objects to `on_object` until it returns True (then True).

        False when the server ends the stream: the API server drops a watcher that falls
        behind a burst; resume from the last object's resourceVersion. Raises
        `WatchExpired` when that version is too old.
        """
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context)
        try:
            conn.request(
                "GET",
                f"{path}?watch=1&resourceVersion={resource_version}"
                "&allowWatchBookmarks=true&timeoutSeconds=3600",
                headers={"Accept": "application/json"},
            )
            resp = conn.getresponse()
            if resp.status == 410:
                raise WatchExpired(resource_version)
            if resp.status != 200:
                raise RuntimeError(f"watch {path}: HTTP {resp.status}: {resp.read()[:500]!r}")
            # One JSON event per line; HTTPResponse.readline can stop early on chunked bodies.
            buffer = b""
            while chunk := resp.read1(1 << 16):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        if event["object"].get("code") == 410:
                            raise WatchExpired(resource_version)
                        raise RuntimeError(f"watch {path}: {event['object']}")
                    if on_object(event["object"]):
                        return True
            return False
        except (http.client.HTTPException, OSError):
            return False
        finally:
            conn.close()


class WatchExpired(RuntimeError):
    """The watch's resourceVersion is no longer available (HTTP 410): list again."""


def follow(api: _Api, path: str, on_object: Callable[[dict[str, Any]], bool]) -> None:
    """List and watch `path` until `on_object` returns True, resuming dropped watches.

    `on_object` sees every object in the list and then every watched change; bookmarks
    only move the resume point.
    """
    version = ""
    while True:
        if not version:
            listed = api.request("GET", path)
            version = listed["metadata"]["resourceVersion"]
            if any(on_object(item) for item in listed["items"]):
                return

        def seen(obj: dict[str, Any]) -> bool:
            nonlocal version
            version = obj["metadata"]["resourceVersion"]
            # A bookmark carries only a resourceVersion.
            return "name" in obj["metadata"] and on_object(obj)

        try:
            if api.watch(path, version, seen):
                return
        except WatchExpired:
            version = ""


def _parallel(threads: int, work: Callable[[Any], None], items: Sequence[Any]) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(work, items):
            pass


class ReplayCluster:
    """One harness control plane holding the trace's nodes; `run` replays the pods once.

    With `fleet="realistic"` the nodes report allocatable as kubelets do and run the DaemonSet
    pods of bench/fleet.py before any run (see that module; `daemonsets=False` leaves the pods
    out, keeping allocatable and images); with `gangs` the API server serves PodGroups (the
    stack's GANG_APISERVER_FLAGS), which runs of pods naming jobs need; with `dra` the nodes'
    GPUs are devices of ResourceSlices and the pods claim them (bench/dra.py); `view` is the
    nodes as the scheduler then sees them. Between runs every pod of the trace is deleted at
    once (grace period 0: no kubelet ever confirms a deletion here), and with `dra` every
    claim, so each run starts from the same nodes. Use as a context manager.
    """

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        *,
        fleet: str = "bare",
        seed: int = 1,
        daemonsets: bool = True,
        gangs: bool = False,
        dra: bool = False,
        threads: int = 16,
        log: Callable[[str], None] = print,
    ) -> None:
        from tools.harness import LocalControlPlane
        from tools.harness.stack import GANG_APISERVER_FLAGS

        if fleet not in FLEETS:
            raise ValueError(f"fleet {fleet!r}: expected one of {', '.join(FLEETS)}")
        self.nodes = nodes
        self.fleet = fleet
        self.seed = seed
        self.daemonsets = fleet == "realistic" and daemonsets
        self.threads = threads
        self.log = log
        self.gangs = gangs
        self.dra = dra
        self._claim_controller: ManagedProcess | None = None
        self._templates: set[str] = set()
        self.cp = LocalControlPlane(GANG_APISERVER_FLAGS if gangs else ())
        self.api: _Api | None = None
        self.view = [self._seen(node) for node in nodes]

    def _allocatable(self, node: TraceNode) -> tuple[int, int]:
        if self.fleet == "bare":
            return node.cpu_milli, node.memory_mib
        return fleet.allocatable(node.name, node.cpu_milli, node.memory_mib, self.seed)

    def _seen(self, node: TraceNode) -> TraceNode:
        """`node` as the scheduler sees it: allocatable less the DaemonSet pods."""
        cpu, memory = self._allocatable(node)
        if self.daemonsets:
            system_cpu, system_memory = fleet.daemonset_requests()
            cpu, memory = cpu - system_cpu, memory - system_memory
        return replace(node, cpu_milli=cpu, memory_mib=memory)

    def __enter__(self) -> ReplayCluster:
        self.cp.start()
        try:
            self.api = _Api(self.cp.server, self.cp.ssl_context())
            started = time.monotonic()
            self.cp.create_namespace(NAMESPACE)
            if self.dra:
                from tools.harness.dra import device_classes

                for device_class in device_classes():
                    self.api.request("POST", dra_objects.DEVICE_CLASSES, device_class)
            _parallel(self.threads, self._create_node, self.nodes)
            self.log(f"{len(self.nodes)} nodes created in {time.monotonic() - started:.0f} s")
            if self.daemonsets:
                self._run_daemonsets()
            if self.dra:
                self._claim_controller = self._controller_manager(dra_objects.CLAIM_CONTROLLER)
                self._claim_controller.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._claim_controller is not None:
            self._claim_controller.stop()
        self.cp.stop()

    def _controller_manager(self, controllers: str) -> ManagedProcess:
        """kube-controller-manager running only `controllers`, with the admin credentials."""
        from tools.harness import ManagedProcess, free_port, require_tool

        kubeconfig = str(self.cp.kubeconfig_path)
        return ManagedProcess(
            "kube-controller-manager",
            [
                str(require_tool("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                f"--controllers={controllers}",
                f"--kube-api-qps={CLIENT_QPS}",
                f"--kube-api-burst={CLIENT_QPS}",
            ],
            self.cp.workdir / f"kube-controller-manager-{controllers}.log",
        )

    def _create_node(self, node: TraceNode) -> None:
        assert self.api is not None
        api = self.api
        api.request("POST", "/api/v1/nodes", {"metadata": {"name": node.name}})
        # TaintNodesByCondition adds node.kubernetes.io/not-ready on create; no
        # lifecycle controller runs to lift it, so the taints are set to the pool's.
        api.request(
            "PATCH", f"/api/v1/nodes/{node.name}", {"spec": {"taints": [POOL_TAINT.as_dict()]}}
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        capacity = node_capacity(node)
        if self.dra:
            capacity = dra_objects.dra_capacity(capacity)
            api.request("POST", dra_objects.RESOURCE_SLICES, dra_objects.node_slice(node))
        cpu, memory = self._allocatable(node)
        status: dict[str, Any] = {
            "capacity": capacity,
            "allocatable": {**capacity, "cpu": f"{cpu}m", "memory": f"{memory}Mi"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
        if self.fleet == "realistic":
            status["images"] = fleet.node_images(node.name, self.seed)
        api.request("PATCH", f"/api/v1/nodes/{node.name}/status", {"status": status})

    def _run_daemonsets(self, timeout: float = 900.0) -> None:
        """Create the DaemonSets and wait until each node runs one pod of each.

        The DaemonSet controller (kube-controller-manager, that controller alone) makes the
        pods and a stock kube-scheduler binds them; both stop once every pod is bound, so
        the runs measure the scheduler under test alone.
        """
        assert self.api is not None
        api, cp = self.api, self.cp
        started = time.monotonic()
        # No ServiceAccount controller runs: the pods' `default` accounts are made here.
        for namespace in sorted({spec.namespace for spec in fleet.DAEMONSETS}):
            if namespace == fleet.SYSTEM_NAMESPACE:
                api.request(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"metadata": {"name": "default"}},
                )
            else:
                cp.create_namespace(namespace)
        for spec in fleet.DAEMONSETS:
            api.request(
                "POST",
                f"/apis/apps/v1/namespaces/{spec.namespace}/daemonsets",
                fleet.daemonset_object(spec),
            )
        kubeconfig = str(cp.kubeconfig_path)
        manager = self._controller_manager("daemonset")
        manager.start()
        _, config = scheduler_config("default", kubeconfig)
        expected = len(self.nodes) * len(fleet.DAEMONSETS)
        try:
            with cp.start_scheduler(yaml.safe_dump(config), timeout=120) as scheduler:
                while (bound := self._daemon_pods_bound()) < expected:
                    self.log(f"DaemonSet pods: {bound}/{expected} bound")
                    for what, process in (
                        ("kube-controller-manager", manager),
                        ("kube-scheduler", scheduler),
                    ):
                        if not process.running():
                            raise RuntimeError(f"{what} exited\n{process.tail()}")
                    if time.monotonic() - started > timeout:
                        raise TimeoutError(f"{bound}/{expected} DaemonSet pods bound")
                    time.sleep(5)
        finally:
            manager.stop()
        self.log(f"{expected} DaemonSet pods bound in {time.monotonic() - started:.0f} s")

    def _daemon_pods_bound(self) -> int:
        assert self.api is not None
        bound = 0
        for namespace in sorted({spec.namespace for spec in fleet.DAEMONSETS}):
            pods = self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            bound += sum(1 for pod in pods if pod["spec"].get("nodeName"))
        return bound

    def _clear_pods(self) -> None:
        assert self.api is not None
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        for attempt in range(5):
            try:
                # A loaded API server can take longer than its default 60 s for 8,000 pods;
                # the deletion goes on server-side, so asking again is safe.
                self.api.request("DELETE", f"{path}?gracePeriodSeconds=0&timeout=300s")
            except RuntimeError:
                if attempt == 4:
                    raise
                continue
            break
        left = self.api.request("GET", f"{path}?limit=1")["items"]
        if left:
            raise RuntimeError(f"pods left after deleting them all: {left[0]['metadata']['name']}")
        if self.gangs:
            self._clear_podgroups()
        if self.dra:
            self._clear_claims()

    def _clear_claims(self, timeout: float = 600.0) -> None:
        """Delete every claim of the replay's namespace, lifting the finalizers (the
        scheduler's allocation protection) of those whose pods are gone: the claims' devices
        are free again for the next run."""
        assert self.api is not None
        api = self.api
        path = dra_objects.claims_path(NAMESPACE)
        started = time.monotonic()
        api.request("DELETE", f"{path}?timeout=300s")
        while left := [c["metadata"]["name"] for c in api.request("GET", path)["items"]]:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{len(left)} ResourceClaims left, e.g. {left[0]}")
            _parallel(
                self.threads,
                lambda name: self._drop_finalizers(f"{path}/{name}"),
                left,
            )

    def _drop_finalizers(self, path: str) -> None:
        assert self.api is not None
        try:
            self.api.request("PATCH", path, {"metadata": {"finalizers": None}})
        except RuntimeError as exc:
            if "HTTP 404" not in str(exc):  # gone meanwhile
                raise

    def _clear_podgroups(self) -> None:
        """Delete every PodGroup, lifting the finalizer the PodGroupProtection admission adds:
        its controller, which would lift it once no pod names the group, does not run here."""
        assert self.api is not None
        api = self.api
        api.request("DELETE", PODGROUPS)
        left = [g["metadata"]["name"] for g in api.request("GET", PODGROUPS)["items"]]
        _parallel(
            self.threads,
            lambda name: api.request(
                "PATCH", f"{PODGROUPS}/{name}", {"metadata": {"finalizers": None}}
            ),
            left,
        )
        left = [g["metadata"]["name"] for g in api.request("GET", PODGROUPS)["items"]]
        if left:
            raise RuntimeError(f"PodGroups left after deleting them all: {left[0]}")

    def run(
        self,
        profile: str,
        pods: Sequence[TracePod],
        *,
        settings: SchedulerConfig | None = None,
        score_all: bool = True,
        timeout: float = 1800.0,
    ) -> Metrics:
        """Create the pods, start kube-scheduler with `profile` (`settings` for binpack), wait.

        `score_all` as `scheduler_config` takes it.
        """
        rendered = render(
            profile,
            pods,
            str(self.cp.kubeconfig_path),
            settings=settings,
            score_all=score_all,
            image=self._image,
            dra=self.dra,
        )
        outcome = self._schedule(rendered, timeout)
        return measure(rendered, pods, self.view, self.fleet, outcome)

    def _schedule(self, rendered: Rendered, timeout: float) -> Outcome:
        """Replace the cluster's pods with `rendered`'s, run its scheduler until all are decided."""
        assert self.api is not None
        api, cp, log, profile = self.api, self.cp, self.log, rendered.profile
        started = time.monotonic()
        self._clear_pods()
        if rendered.groups and not self.gangs:
            raise ValueError(
                f"[{profile}] the pods name jobs: start ReplayCluster with gangs=True "
                "(an API server serving PodGroups)"
            )
        _parallel(
            self.threads, lambda group: api.request("POST", PODGROUPS, group), rendered.groups
        )
        self._create_templates(rendered.templates)
        _parallel(
            self.threads,
            lambda pod: api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod),
            rendered.pods,
        )
        if rendered.templates:
            self._wait_for_claims(rendered, timeout)
        total = len(rendered.pods)
        log(
            f"[{profile}] {total} pods created in "
            f"{time.monotonic() - started:.0f} s; starting kube-scheduler"
        )
        decisions = Decisions([pod["metadata"]["name"] for pod in rendered.pods])
        failure: list[BaseException] = []
        done = threading.Event()

        def watch() -> None:
            try:
                follow(api, f"/api/v1/namespaces/{NAMESPACE}/pods", decisions.see)
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=watch, daemon=True).start()
        begin = time.monotonic()
        with cp.start_scheduler(
            yaml.safe_dump(rendered.config, sort_keys=False),
            extra_flags=["--v=3", *rendered.flags],
            timeout=120,
            binary=BINARIES.get(profile, "kube-scheduler"),
        ) as scheduler:
            while not done.wait(10):
                log(f"[{profile}] {total - decisions.remaining}/{total} decided")
                if not scheduler.running():
                    raise RuntimeError(f"kube-scheduler exited\n{scheduler.tail()}")
                if time.monotonic() - begin > timeout:
                    raise TimeoutError(
                        f"{decisions.remaining} pods undecided after {timeout:.0f} s"
                    )
            wall = time.monotonic() - begin
            if failure:
                raise failure[0]
            attempts = first_attempts(scheduler.log())
            _, exposition = scheduler.get("/metrics", timeout=30)
        log(f"[{profile}] every pod decided in {wall:.1f} s")
        return Outcome(
            placed=tuple(decisions.placed),
            messages=tuple(decisions.messages),
            wall_s=wall,
            scheduling_s=decisions.scheduling_s(),
            attempts=tuple(attempts),
            exposition=exposition,
            bound_order=tuple(decisions.bound_order),
        )

    def _create_templates(self, templates: Sequence[dict[str, Any]]) -> None:
        """Create the claim templates not yet in the replay's namespace (once per cluster)."""
        if templates and not self.dra:
            raise ValueError("the pods claim GPUs through DRA: start ReplayCluster with dra=True")
        assert self.api is not None
        for template in templates:
            name = template["metadata"]["name"]
            if name not in self._templates:
                self.api.request("POST", dra_objects.templates_path(NAMESPACE), template)
                self._templates.add(name)

    def _wait_for_claims(self, rendered: Rendered, timeout: float) -> None:
        """Wait until kube-controller-manager made every pod's claims and named them in the
        pods' status: the scheduler's PreEnqueue holds back a pod whose claim is missing, which
        would put it in its queue out of arrival order."""
        assert self.api is not None and self._claim_controller is not None
        controller = self._claim_controller
        wanted = sum(1 for pod in rendered.pods if pod["spec"].get("resourceClaims"))
        started = time.monotonic()
        while True:
            pods = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            made = dra_objects.claims_made(pods)
            if made >= wanted:
                break
            if not controller.running():
                raise RuntimeError(f"kube-controller-manager exited\n{controller.tail()}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"claims of {wanted - made} pods not made after {timeout:.0f} s")
            self.log(f"[{rendered.profile}] claims made for {made}/{wanted} pods")
            time.sleep(5)
        self.log(f"[{rendered.profile}] {wanted} claims made in {time.monotonic() - started:.0f} s")

    def time_job(
        self,
        profile: str,
        pods: Sequence[TracePod],
        *,
        settings: SchedulerConfig | None = None,
        score_all: bool = False,
        timeout: float = 600.0,
    ) -> JobTiming:
        """Submit one job to a running, idle scheduler of `profile` and time it.

        The cluster is emptied of pods, the scheduler started (and ready: its informers
        synced), then the job's PodGroup and its pods are created; the time runs from the
        first creation until the watch sees the last worker decided.
        """
        assert self.api is not None
        api, cp = self.api, self.cp
        rendered = render(
            profile,
            pods,
            str(cp.kubeconfig_path),
            settings=settings,
            score_all=score_all,
            image=self._image,
        )
        if len(rendered.groups) != 1 or len(
            jobs_of(pods)[rendered.groups[0]["metadata"]["name"]]
        ) != len(pods):
            raise ValueError(
                f"expected the workers of one job, got {len(pods)} pods in {len(rendered.groups)} jobs"
            )
        self._clear_pods()
        decisions = Decisions([pod["metadata"]["name"] for pod in rendered.pods])
        done = threading.Event()
        failure: list[BaseException] = []

        def watch() -> None:
            try:
                follow(api, f"/api/v1/namespaces/{NAMESPACE}/pods", decisions.see)
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        with cp.start_scheduler(
            yaml.safe_dump(rendered.config, sort_keys=False),
            extra_flags=list(rendered.flags),
            timeout=300,
            binary=BINARIES.get(profile, "kube-scheduler"),
        ) as scheduler:
            threading.Thread(target=watch, daemon=True).start()
            time.sleep(1)  # the watch's first LIST, before anything is created
            begin = time.monotonic()
            api.request("POST", PODGROUPS, rendered.groups[0])
            _parallel(
                self.threads,
                lambda pod: api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod),
                rendered.pods,
            )
            if not done.wait(timeout):
                raise TimeoutError(f"{decisions.remaining} workers undecided after {timeout:.0f} s")
            if failure:
                raise failure[0]
            _, exposition = scheduler.get("/metrics", timeout=30)
        wall = decisions.decided_at[-1] - begin
        self.log(f"[{profile}] a job of {len(pods)} workers decided in {wall:.2f} s")
        return JobTiming(
            profile=profile,
            nodes=len(self.nodes),
            fleet=self.fleet,
            workers=len(pods),
            bound=sum(1 for node in decisions.placed if node),
            wall_s=wall,
            group_cycle_s=attempt_mean(exposition, GROUP_ATTEMPT_METRIC),
        )

    def _image(self, pod: TracePod) -> str:
        return TRACE_IMAGE if self.fleet == "bare" else fleet.pod_image(pod.name, self.seed)


def replay(
    profile: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    *,
    threads: int = 16,
    timeout: float = 1800.0,
    log: Callable[[str], None] = print,
) -> Metrics:
    """One run in a fresh control plane: create nodes and pods, start the scheduler, wait."""
    with ReplayCluster(nodes, threads=threads, log=log) as cluster:
        return cluster.run(profile, pods, timeout=timeout)
