"""Replay the openb GPU trace through the real kube-scheduler: default, binpack, fragmentation.

Every pod of the trace is created in a harness control plane (etcd + kube-apiserver) with the
trace's GPU nodes as fake, Ready Node objects, then kube-scheduler is started with one profile
and the replay waits until each pod is bound or marked Unschedulable; for the next profile the
pods are deleted and created again on the same nodes. Every profile sees the same nodes and the
same pods in the same order (creation_time) and sets percentageOfNodesToScore: 100, so every
feasible node is scored. The fragmentation profile runs the built gpu-binpack-scheduler
(kube-scheduler with the GpuFragmentation plugin, scheduler/).

Mapping: a pod requests num_gpu whole nvidia.com/gpu (a shared GPU, gpu_milli
< 1000, rounds up to one, since the stack does not enable GPU sharing), and cpu_milli and
memory_mib as cpu and memory requests. A node offers its cpu_milli, memory_mib, gpu and 110
pods (the kubelet default), and carries the GPU pool's taint, which every pod tolerates (all
trace nodes are GPU nodes, CPU-only pods included). No pod departs.

Ordering: pods are created before the scheduler starts, named in trace order; the scheduler's
first LIST (a plain LIST: its streaming list is turned off) returns them sorted by name, so its
FIFO queue holds them in trace order. The
scheduler's own log (-v=3, "Attempting to schedule pod") is checked for that order and the
number of first attempts out of order is reported. With no departures, the pods bound before
pod i are then exactly the bound pods that precede it in the trace, which is what the
metrics use.

    .venv/bin/python -m bench.openb_replay ../shared/traces/openb
    .venv/bin/python -m bench.openb_replay ../shared/traces/openb --limit 500 --node-limit 100
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from bench import fleet
from components.binpack_scheduler_manifests import render_config
from components.binpack_scheduler_settings import FRAGMENTATION
from components.gpu_resources import WHOLE_GPU
from components.tainted_gpu_pool import Taint
from stack_config import SchedulerConfig

REPO_ROOT = Path(__file__).resolve().parents[1]

GPU = WHOLE_GPU
NODE_PODS = 110
NAMESPACE = "openb"
FLEETS = ("bare", "realistic")
PROFILES = ("default", "mostallocated", "binpack", "fragmentation")
# The Kubernetes documentation's bin-packing example ("Resource Bin Packing"): MostAllocated,
# cpu and memory weight 1, the extended resource 3.
MOST_ALLOCATED_WEIGHTS = {"cpu": 1, "memory": 1, GPU: 3}
GPU_COUNTS = (1, 2, 4, 8)
DEFAULT_NODES_FILE = "openb_node_list_gpu_node.csv"
DEFAULT_PODS_FILE = "openb_pod_list_default.csv"
DEFAULT_CSV = REPO_ROOT / "bench" / "results" / "openb.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time")
POOL_TAINT = Taint()
TRACE_IMAGE = "registry.invalid/trace:1"
CLIENT_QPS = 5000
# kube-scheduler v1.37 fills its informers with a streaming watch (the WatchListClient
# feature), whose initial events did not come in name order here (288 of 300 first attempts
# out of trace order in a 300-pod run); a plain LIST returns the pods sorted by name.
SCHEDULER_FLAGS = ("--feature-gates=WatchListClient=false",)
# The built tool each profile runs: the fragmentation profile needs the GpuFragmentation plugin
# (scheduler/, built by tools/build-tools.sh); the image only satisfies the settings' check.
BINARIES = {"fragmentation": "gpu-binpack-scheduler"}
BENCH_IMAGE = "localhost/gpu-binpack-scheduler:bench"
# The stack's scheduler settings each of its profiles renders when the caller gives none.
STACK_SETTINGS: dict[str, Callable[[], SchedulerConfig]] = {
    "binpack": SchedulerConfig,
    "fragmentation": lambda: SchedulerConfig(scoring=FRAGMENTATION, image=BENCH_IMAGE),
}
ATTEMPT = re.compile(r'"Attempting to schedule pod" pod="' + NAMESPACE + r"/p(\d+)-")


CURVE_COLUMNS = ("arrived", "allocated", "arrived_shared", "allocated_shared")


class TraceError(ValueError):
    """A trace file is missing a column or holds a value out of range."""


# ------------------------------------------------------------------------------ trace


@dataclass(frozen=True, kw_only=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True, kw_only=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    """Whole GPUs requested (shared GPUs rounded up to one)."""
    creation_time: int
    deletion_time: int | None = None
    gpu_milli: int = 1000
    """Thousandths of each GPU the pod uses (below 1000: it shares one)."""

    @property
    def gpu_share(self) -> float:
        """GPUs the pod uses, a shared GPU counted as its fraction."""
        return self.gpus * min(self.gpu_milli, 1000) / 1000 if self.gpus else 0.0


def gpu_request(num_gpu: int, gpu_milli: int) -> int:
    """Whole nvidia.com/gpu a trace pod asks for: num_gpu, and at least one if it shares one."""
    if num_gpu == 0 and gpu_milli > 0:
        return 1
    return num_gpu


def _int(path: Path, line: int, row: Mapping[str, str], column: str, low: int = 0) -> int:
    raw = row.get(column)
    try:
        value = int(raw or "")
    except ValueError:
        value = low - 1
    if value < low:
        raise TraceError(
            f"{path}:{line}: column {column!r} is {raw!r}; expected an integer >= {low}"
        )
    return value


def _rows(path: Path, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(columns)}"
            )
        yield from enumerate(reader, start=2)


def read_nodes(path: Path) -> list[TraceNode]:
    """The node list, in file order."""
    return [
        TraceNode(
            name=row["sn"],
            cpu_milli=_int(path, line, row, "cpu_milli", 1),
            memory_mib=_int(path, line, row, "memory_mib", 1),
            gpus=_int(path, line, row, "gpu"),
        )
        for line, row in _rows(path, NODE_COLUMNS)
    ]


def read_pods(path: Path) -> list[TracePod]:
    """The pod list in arrival order (creation_time, then file order)."""
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        gpu_milli = _int(path, line, row, "gpu_milli")
        if gpu_milli > 1000:
            raise TraceError(
                f"{path}:{line}: column 'gpu_milli' is {gpu_milli}; expected 0..1000 (per GPU)"
            )
        deletion = (row.get("deletion_time") or "").strip()
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=gpu_request(_int(path, line, row, "num_gpu"), gpu_milli),
                creation_time=_int(path, line, row, "creation_time"),
                deletion_time=_int(path, line, row, "deletion_time") if deletion else None,
                gpu_milli=gpu_milli,
            )
        )
    return sorted(pods, key=lambda p: p.creation_time)  # stable: ties keep file order


# ---------------------------------------------------------------------------- metrics


@dataclass(frozen=True, kw_only=True)
class Metrics:
    profile: str
    nodes: int
    total_gpus: int
    pods: int
    bound: int
    first_frag_index: int | None
    """Trace position of the first GPU pod rejected although the free GPUs in total fit it
    and it fits an empty node of the cluster."""
    first_frag_gpus: int | None
    alloc_at_first_frag: float | None
    """Allocated / total GPUs just before that pod."""
    alloc_at_first_gpu_frag: float | None
    """The same for the first such pod for which no single node had the GPUs free."""
    rejected_gpu_frag: int
    """GPU pods rejected while the free GPUs in total fit them and no node had them free."""
    rejected_stranded: int
    """GPU pods rejected although some node had the GPUs free (short of cpu/memory there)."""
    final_alloc: float
    rejected_by_gpus: Mapping[int, int]
    """Rejected pods by whole GPUs requested (0 = CPU-only)."""
    wall_s: float
    out_of_order: int | None = None
    """First scheduling attempts that came before an earlier trace pod's (None: not checked)."""
    run: int = 1
    """Repetition number (--repeat): ties between equal nodes are broken at random."""
    percentage_of_nodes_to_score: int | None = 100
    """The profile's percentageOfNodesToScore (None: the scheduler's adaptive default)."""
    fits_no_node: int = 0
    """Pods that fit no empty node of the cluster (never counted as fragmentation)."""
    alloc_shared_at_first_frag: float | None = None
    """Allocation just before the first fragmentation rejection, a shared GPU counted as its
    fraction."""
    final_alloc_shared: float = 0.0
    """Final allocation, a shared GPU counted as its fraction."""
    fleet: str = "bare"
    """The cluster: "bare" (the trace's nodes as they are) or "realistic" (bench/fleet.py)."""
    order: int = 0
    """Arrival order: 0 the trace's, n > 0 shuffled with seed n."""
    scheduling_s: float | None = None
    """From the first pod decided to the last (as the watch saw them)."""
    attempt_p99_s: float | None = None
    """99th percentile of the scheduler's attempt latency (its histogram, all results)."""
    attempt_mean_s: float | None = None
    algorithm_p99_s: float | None = None
    """99th percentile of the scheduling algorithm's latency (filter and score, no binding)."""
    curve: tuple[tuple[float, float, float, float], ...] = ()
    """After each pod: (arrived GPU demand / total, allocated / total), whole GPUs, then the
    same with shared GPUs as fractions."""


def fits(pod: TracePod, node: TraceNode) -> bool:
    """Whether `pod` fits `node` when nothing of the trace runs there."""
    return (
        pod.gpus <= node.gpus
        and pod.cpu_milli <= node.cpu_milli
        and pod.memory_mib <= node.memory_mib
    )


def fitting(pods: Sequence[TracePod], nodes: Sequence[TraceNode]) -> list[bool]:
    """For each pod, whether some empty node fits it (`nodes` as the scheduler sees them)."""
    shapes = {(n.gpus, n.cpu_milli, n.memory_mib): n for n in nodes}.values()
    return [any(fits(pod, node) for node in shapes) for pod in pods]


def compute_metrics(
    profile: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    placed: Sequence[str | None],
    wall_s: float,
    out_of_order: int | None = None,
    messages: Sequence[str] | None = None,
) -> Metrics:
    """Metrics of one run; `placed[i]` is pod i's node, or None if it was rejected.

    `nodes` are the nodes as the scheduler saw them before the first trace pod (allocatable
    net of the system pods); `messages[i]` is a rejected pod's Unschedulable message (see
    `no_node_has_gpus`). A rejected pod that fits no empty node is counted apart, never as
    fragmentation.

    Pods are taken in trace order and never leave, so the GPUs allocated when pod i was
    decided are those of the bound pods before it.
    """
    if len(placed) != len(pods):
        raise ValueError(f"{len(placed)} outcomes for {len(pods)} pods")
    total = sum(n.gpus for n in nodes)
    if total <= 0:
        raise ValueError("the node list has no GPUs")
    can_fit = fitting(pods, nodes)
    allocated = 0
    shared = arrived = arrived_shared = 0.0
    first: tuple[int, int, float, float] | None = None
    first_gpu_frag: float | None = None
    gpu_frag = stranded = 0
    rejected: Counter[int] = Counter()
    curve = []
    for index, (pod, node) in enumerate(zip(pods, placed, strict=True)):
        arrived += pod.gpus
        arrived_shared += pod.gpu_share
        if node is not None:
            allocated += pod.gpus
            shared += pod.gpu_share
        else:
            rejected[pod.gpus] += 1
            if pod.gpus > 0 and total - allocated >= pod.gpus and can_fit[index]:
                if first is None:
                    first = (index, pod.gpus, allocated / total, shared / total)
                if messages and no_node_has_gpus(messages[index]):
                    gpu_frag += 1
                    if first_gpu_frag is None:
                        first_gpu_frag = allocated / total
                elif messages:
                    stranded += 1
        curve.append((arrived / total, allocated / total, arrived_shared / total, shared / total))
    return Metrics(
        profile=profile,
        nodes=len(nodes),
        total_gpus=total,
        pods=len(pods),
        bound=sum(1 for node in placed if node is not None),
        first_frag_index=first[0] if first else None,
        first_frag_gpus=first[1] if first else None,
        alloc_at_first_frag=first[2] if first else None,
        alloc_at_first_gpu_frag=first_gpu_frag,
        rejected_gpu_frag=gpu_frag,
        rejected_stranded=stranded,
        final_alloc=allocated / total,
        rejected_by_gpus=dict(sorted(rejected.items())),
        wall_s=wall_s,
        out_of_order=out_of_order,
        fits_no_node=can_fit.count(False),
        alloc_shared_at_first_frag=first[3] if first else None,
        final_alloc_shared=shared / total,
        curve=tuple(curve),
    )


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


CSV_FIELDS = (
    "fleet",
    "order",
    "profile",
    "run",
    "percentage_of_nodes_to_score",
    "nodes",
    "total_gpus",
    "pods",
    "bound",
    "first_frag_index",
    "first_frag_gpus",
    "alloc_at_first_frag",
    "alloc_at_first_gpu_frag",
    "final_alloc",
    "alloc_shared_at_first_frag",
    "final_alloc_shared",
    "fits_no_node",
    "rejected_0gpu",
    *(f"rejected_{n}gpu" for n in GPU_COUNTS),
    "rejected_other",
    "rejected_gpu_frag",
    "rejected_stranded",
    "out_of_order_attempts",
    "wall_s",
    "scheduling_s",
    "attempt_p99_ms",
    "attempt_mean_ms",
    "algorithm_p99_ms",
)


def milliseconds(seconds: float | None) -> str:
    """Seconds as milliseconds with two decimals; "" when unknown."""
    return "" if seconds is None else f"{seconds * 1000:.2f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def csv_row(m: Metrics) -> dict[str, str]:
    other = sum(c for g, c in m.rejected_by_gpus.items() if g not in (0, *GPU_COUNTS))
    row = {
        "fleet": m.fleet,
        "order": str(m.order),
        "profile": m.profile,
        "run": str(m.run),
        "percentage_of_nodes_to_score": (
            "adaptive"
            if m.percentage_of_nodes_to_score is None
            else str(m.percentage_of_nodes_to_score)
        ),
        "nodes": str(m.nodes),
        "total_gpus": str(m.total_gpus),
        "pods": str(m.pods),
        "bound": str(m.bound),
        "first_frag_index": "" if m.first_frag_index is None else str(m.first_frag_index),
        "first_frag_gpus": "" if m.first_frag_gpus is None else str(m.first_frag_gpus),
        "alloc_at_first_frag": _ratio(m.alloc_at_first_frag),
        "alloc_at_first_gpu_frag": _ratio(m.alloc_at_first_gpu_frag),
        "final_alloc": _ratio(m.final_alloc),
        "alloc_shared_at_first_frag": _ratio(m.alloc_shared_at_first_frag),
        "final_alloc_shared": _ratio(m.final_alloc_shared),
        "fits_no_node": str(m.fits_no_node),
        "rejected_0gpu": str(m.rejected_by_gpus.get(0, 0)),
        **{f"rejected_{n}gpu": str(m.rejected_by_gpus.get(n, 0)) for n in GPU_COUNTS},
        "rejected_other": str(other),
        "rejected_gpu_frag": str(m.rejected_gpu_frag),
        "rejected_stranded": str(m.rejected_stranded),
        "out_of_order_attempts": "" if m.out_of_order is None else str(m.out_of_order),
        "wall_s": f"{m.wall_s:.1f}",
        "scheduling_s": "" if m.scheduling_s is None else f"{m.scheduling_s:.2f}",
        "attempt_p99_ms": milliseconds(m.attempt_p99_s),
        "attempt_mean_ms": milliseconds(m.attempt_mean_s),
        "algorithm_p99_ms": milliseconds(m.algorithm_p99_s),
    }
    return row


def write_rows(path: Path, fields: Sequence[str], rows: Iterable[Mapping[str, str]]) -> None:
    """A CSV file with `fields` as its header, one line per row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_csv(path: Path, results: Sequence[Metrics]) -> None:
    write_rows(path, CSV_FIELDS, (csv_row(m) for m in results))


CURVE_FIELDS = ("fleet", "order", "profile", "run", "pod", *CURVE_COLUMNS)
CURVE_STEP = 25
"""Every CURVE_STEP-th pod (and the last) goes into the curve file."""


def write_curves(path: Path, results: Sequence[Metrics]) -> None:
    """The allocation curves of `results`, one row per sampled pod."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CURVE_FIELDS)
        for m in results:
            last = len(m.curve) - 1
            for index, point in enumerate(m.curve):
                if index % CURVE_STEP and index != last:
                    continue
                writer.writerow(
                    [m.fleet, m.order, m.profile, m.run, index, *(f"{v:.5f}" for v in point)]
                )


def first_frag_or_final(m: Metrics, shared: bool = False) -> float:
    """Allocation at the first fragmentation rejection; the final one if none came."""
    value = m.alloc_shared_at_first_frag if shared else m.alloc_at_first_frag
    if value is not None:
        return value
    return m.final_alloc_shared if shared else m.final_alloc


def _spread(values: Sequence[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.1%}"
    return f"{mean:.1%} ({min(values):.1%}-{max(values):.1%})"


def summary_table(results: Sequence[Metrics]) -> str:
    """A Markdown table: per fleet and profile, the mean over arrival orders (min-max)."""
    groups: dict[tuple[str, str], list[Metrics]] = {}
    for m in results:
        groups.setdefault((m.fleet, m.profile), []).append(m)
    lines = [
        "| fleet | profile | orders | alloc. at first frag. rejection | final alloc. "
        "| same, shared GPUs as fractions: first frag. / final | 4+8-GPU pods rejected "
        "| first frag. rejections that never came |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (kind, profile), runs in groups.items():
        large = [m.rejected_by_gpus.get(4, 0) + m.rejected_by_gpus.get(8, 0) for m in runs]
        lines.append(
            f"| {kind} | {profile} | {len(runs)} "
            f"| {_spread([first_frag_or_final(m) for m in runs])} "
            f"| {_spread([m.final_alloc for m in runs])} "
            f"| {_spread([first_frag_or_final(m, True) for m in runs])} / "
            f"{_spread([m.final_alloc_shared for m in runs])} "
            f"| {sum(large) / len(large):.1f} "
            f"| {sum(1 for m in runs if m.alloc_at_first_frag is None)} |"
        )
    return "\n".join(lines)


def run_label(m: Metrics) -> str:
    """The profile, and the fleet, order and repetition where they are not the first."""
    label = m.profile
    if m.fleet != "bare":
        label = f"{m.fleet} {label}"
    if m.order:
        label += f" order {m.order}"
    return label + (f" #{m.run}" if m.run > 1 else "")


def format_table(results: Sequence[Metrics]) -> str:
    """A Markdown table, one row per profile."""
    head = (
        "| profile | alloc. at first frag. rejection (pod #, GPUs) "
        "| same, no node with the GPUs free | final alloc. "
        "| rejected 1/2/4/8-GPU | rejected CPU-only "
        "| GPU pods rejected: GPU-fragmented / stranded | bound / pods | wall s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for m in results:
        if m.alloc_at_first_frag is None:
            frag = "none"
        else:
            frag = f"{m.alloc_at_first_frag:.1%} (#{m.first_frag_index}, {m.first_frag_gpus})"
        gpu_frag = (
            "none" if m.alloc_at_first_gpu_frag is None else f"{m.alloc_at_first_gpu_frag:.1%}"
        )
        by_gpus = "/".join(str(m.rejected_by_gpus.get(n, 0)) for n in GPU_COUNTS)
        lines.append(
            f"| {run_label(m)} | {frag} | {gpu_frag} | {m.final_alloc:.1%} | {by_gpus} "
            f"| {m.rejected_by_gpus.get(0, 0)} | {m.rejected_gpu_frag} / {m.rejected_stranded} "
            f"| {m.bound} / {m.pods} | {m.wall_s:.0f} |"
        )
    return "\n".join(lines)


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
        raise ValueError(f"profile {profile!r}: expected one of {', '.join(PROFILES)}")
    # Same client rate for both: the replay measures scoring, not client-side throttling.
    config["clientConnection"].update(qps=CLIENT_QPS, burst=CLIENT_QPS)
    return name, config


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


def pod_object(
    index: int, pod: TracePod, scheduler_name: str, image: str = TRACE_IMAGE
) -> dict[str, Any]:
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits = {}
    if pod.gpus:
        # Extended resources cannot be overcommitted: limits must equal requests.
        requests[GPU] = limits[GPU] = str(pod.gpus)
    return {
        "metadata": {"name": pod_name(index, pod), "labels": {"trace": "openb"}},
        "spec": {
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


_FIT_SUMMARY = re.compile(r"^0/(?P<nodes>\d+) nodes are available: (?P<reasons>.*?)\.(?: |$)")


def no_node_has_gpus(message: str) -> bool:
    """Whether the Unschedulable message says every node was short of nvidia.com/gpu.

    kube-scheduler writes "0/3 nodes are available: 3 Insufficient nvidia.com/gpu,
    1 Insufficient cpu. preemption: ..."; a node short of several resources is counted
    under each. False when some node had the GPUs but lacked cpu, memory or pod slots.
    """
    match = _FIT_SUMMARY.search(message)
    if match is None:
        return False
    for reason in match["reasons"].split(","):
        count, _, what = reason.strip().partition(" ")
        if what == f"Insufficient {GPU}" and count == match["nodes"]:
            return True
    return False


ATTEMPT_METRIC = "scheduler_scheduling_attempt_duration_seconds"
ALGORITHM_METRIC = "scheduler_scheduling_algorithm_duration_seconds"
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def _samples(exposition: str, name: str) -> Iterable[tuple[dict[str, str], float]]:
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            yield labels, float(match["value"])


def attempt_quantile(exposition: str, q: float, metric: str = ATTEMPT_METRIC) -> float | None:
    """The q-quantile of one of the scheduler's latency histograms, from its buckets.

    Buckets of every result and profile are added up; inside a bucket the latency is taken
    as spread evenly (as PromQL's histogram_quantile does). None without observations.
    """
    buckets: dict[float, float] = {}
    for labels, value in _samples(exposition, f"{metric}_bucket"):
        bound = float(labels["le"])
        buckets[bound] = buckets.get(bound, 0.0) + value
    if not buckets or buckets.get(float("inf"), 0.0) <= 0:
        return None
    bounds = sorted(buckets)
    rank = q * buckets[float("inf")]
    lower, below = 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (buckets[bound] - below) if buckets[bound] > below else 1
            return lower + (bound - lower) * share
        lower, below = bound, buckets[bound]
    return lower


def attempt_mean(exposition: str) -> float | None:
    """The scheduler's mean attempt latency (its histogram's sum over count)."""
    total = sum(v for _, v in _samples(exposition, f"{ATTEMPT_METRIC}_sum"))
    count = sum(v for _, v in _samples(exposition, f"{ATTEMPT_METRIC}_count"))
    return total / count if count else None


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
    out, keeping allocatable and images); `view` is the nodes as the
    scheduler then sees them. Between runs every pod of the trace is deleted at once (grace
    period 0: no kubelet ever confirms a deletion here), so each run starts from the same
    nodes. Use as a context manager.
    """

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        *,
        fleet: str = "bare",
        seed: int = 1,
        daemonsets: bool = True,
        threads: int = 16,
        log: Callable[[str], None] = print,
    ) -> None:
        from tools.harness import LocalControlPlane

        if fleet not in FLEETS:
            raise ValueError(f"fleet {fleet!r}: expected one of {', '.join(FLEETS)}")
        self.nodes = nodes
        self.fleet = fleet
        self.seed = seed
        self.daemonsets = fleet == "realistic" and daemonsets
        self.threads = threads
        self.log = log
        self.cp = LocalControlPlane()
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
            _parallel(self.threads, self._create_node, self.nodes)
            self.log(f"{len(self.nodes)} nodes created in {time.monotonic() - started:.0f} s")
            if self.daemonsets:
                self._run_daemonsets()
        except BaseException:
            self.cp.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cp.stop()

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
        from tools.harness.controlplane import ManagedProcess, free_port, require_tool

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
        manager = ManagedProcess(
            "kube-controller-manager",
            [
                str(require_tool("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--controllers=daemonset",
                f"--kube-api-qps={CLIENT_QPS}",
                f"--kube-api-burst={CLIENT_QPS}",
            ],
            cp.workdir / "kube-controller-manager.log",
        )
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
        assert self.api is not None
        api, cp, log = self.api, self.cp, self.log
        scheduler_name, config = scheduler_config(
            profile, str(cp.kubeconfig_path), settings, score_all=score_all
        )
        started = time.monotonic()
        self._clear_pods()
        _parallel(
            self.threads,
            lambda item: api.request(
                "POST",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                pod_object(item[0], item[1], scheduler_name, self._image(item[1])),
            ),
            list(enumerate(pods)),
        )
        log(
            f"[{profile}] {len(pods)} pods created in "
            f"{time.monotonic() - started:.0f} s; starting kube-scheduler"
        )

        index_of = {pod_name(i, p): i for i, p in enumerate(pods)}
        placed: list[str | None] = [None] * len(pods)
        messages = [""] * len(pods)
        decided = [False] * len(pods)
        seen_at: list[float] = []
        remaining = [len(pods)]
        failure: list[BaseException] = []
        done = threading.Event()

        def on_pod(obj: dict[str, Any]) -> bool:
            index = index_of.get(obj["metadata"]["name"])
            if index is None:
                return False
            is_decided, node, message = decision(obj)
            if is_decided:
                if not decided[index]:
                    decided[index] = True
                    remaining[0] -= 1
                    seen_at.append(time.monotonic())
                placed[index] = node or placed[index]
                messages[index] = message or messages[index]
            return remaining[0] == 0

        def watch() -> None:
            try:
                follow(api, f"/api/v1/namespaces/{NAMESPACE}/pods", on_pod)
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        begin = time.monotonic()
        with cp.start_scheduler(
            yaml.safe_dump(config, sort_keys=False),
            extra_flags=["--v=3", *SCHEDULER_FLAGS],
            timeout=120,
            binary=BINARIES.get(profile, "kube-scheduler"),
        ) as scheduler:
            while not done.wait(10):
                log(f"[{profile}] {len(pods) - remaining[0]}/{len(pods)} decided")
                if not scheduler.running():
                    raise RuntimeError(f"kube-scheduler exited\n{scheduler.tail()}")
                if time.monotonic() - begin > timeout:
                    raise TimeoutError(f"{remaining[0]} pods undecided after {timeout:.0f} s")
            wall = time.monotonic() - begin
            scheduling = seen_at[-1] - seen_at[0] if len(seen_at) > 1 else None
            if failure:
                raise failure[0]
            attempts = first_attempts(scheduler.log())
            _, exposition = scheduler.get("/metrics", timeout=30)
        log(f"[{profile}] every pod decided in {wall:.1f} s")
        late = out_of_order_attempts(attempts) if len(attempts) == len(pods) else None
        metrics = compute_metrics(profile, self.view, pods, placed, wall, late, messages)
        percentage = config["profiles"][0].get("percentageOfNodesToScore")
        return replace(
            metrics,
            percentage_of_nodes_to_score=percentage,
            fleet=self.fleet,
            scheduling_s=scheduling,
            attempt_p99_s=attempt_quantile(exposition, 0.99),
            attempt_mean_s=attempt_mean(exposition),
            algorithm_p99_s=attempt_quantile(exposition, 0.99, ALGORITHM_METRIC),
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


def add_trace_arguments(parser: argparse.ArgumentParser, csv_default: Path) -> None:
    """The arguments naming a trace and its slice (the replay's and the sweep's)."""
    parser.add_argument("trace", type=Path, help="trace directory (e.g. ../shared/traces/openb)")
    parser.add_argument("--pods-file", default=DEFAULT_PODS_FILE, help="pod list in trace")
    parser.add_argument("--nodes-file", default=DEFAULT_NODES_FILE, help="node list in trace")
    parser.add_argument("--csv", type=Path, default=csv_default, help="CSV to write")
    parser.add_argument("--limit", type=int, help="replay only the first N pods")
    parser.add_argument("--node-limit", type=int, help="use only the first N nodes")


def load_trace(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[TraceNode], list[TracePod]]:
    """The nodes and pods `add_trace_arguments` named; a bad limit or trace is a usage error."""
    for flag, value in (("--limit", args.limit), ("--node-limit", args.node_limit)):
        if value is not None and value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    try:
        nodes = read_nodes(args.trace / args.nodes_file)[: args.node_limit]
        pods = read_pods(args.trace / args.pods_file)[: args.limit]
    except TraceError as exc:
        parser.error(str(exc))
    return nodes, pods


def arrival_order(pods: Sequence[TracePod], order: int) -> list[TracePod]:
    """The pods in arrival order `order`: 0 the trace's, n > 0 shuffled with seed n."""
    if order == 0:
        return list(pods)
    return random.Random(order).sample(list(pods), len(pods))


def _choices(
    parser: argparse.ArgumentParser, flag: str, raw: str, allowed: Sequence[str]
) -> list[str]:
    chosen = [item.strip() for item in raw.split(",") if item.strip()]
    if not chosen or any(item not in allowed for item in chosen):
        parser.error(f"{flag} {raw!r}: expected some of {', '.join(allowed)}")
    return chosen


def _orders(parser: argparse.ArgumentParser, raw: str) -> list[int]:
    try:
        orders = [int(item) for item in raw.split(",") if item.strip()]
    except ValueError:
        orders = []
    if not orders or min(orders) < 0:
        parser.error(f"--orders {raw!r}: expected comma-separated integers >= 0 (0: the trace's)")
    return orders


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_arguments(parser, DEFAULT_CSV)
    parser.add_argument(
        "--profiles", default=",".join(PROFILES), help=f"comma-separated: {','.join(PROFILES)}"
    )
    parser.add_argument(
        "--fleets", default="bare", help=f"comma-separated: {','.join(FLEETS)} (bench/fleet.py)"
    )
    parser.add_argument(
        "--orders", default="0", help="arrival orders: 0 the trace's, n > 0 shuffled with seed n"
    )
    parser.add_argument("--fleet-seed", type=int, default=1, help="the realistic fleet's seed")
    parser.add_argument("--threads", type=int, default=16, help="parallel object creation")
    parser.add_argument("--repeat", type=int, default=1, help="runs per profile")
    args = parser.parse_args(argv)
    profiles = _choices(parser, "--profiles", args.profiles, PROFILES)
    fleets = _choices(parser, "--fleets", args.fleets, FLEETS)
    orders = _orders(parser, args.orders)
    for flag, value in (("--repeat", args.repeat), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    nodes, pods = load_trace(parser, args)
    results = []
    for kind in fleets:
        with ReplayCluster(
            nodes, fleet=kind, seed=args.fleet_seed, threads=args.threads
        ) as cluster:
            for order in orders:
                arrived = arrival_order(pods, order)
                for run in range(1, args.repeat + 1):
                    for profile in profiles:
                        m = cluster.run(profile, arrived)
                        results.append(replace(m, run=run, order=order))
                        write_csv(args.csv, results)
    print()
    print(format_table(results))
    print()
    print(summary_table(results))
    curves = args.csv.with_suffix(".curve.csv")
    write_curves(curves, results)
    print(f"\nwrote {args.csv} and {curves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
