"""What a replay run measured, and its files and tables.

The metrics are computed from where each pod went (`compute_metrics`), the latencies from the
scheduler's own histograms (`attempt_quantile`); `write_csv` / `write_curves` and the Markdown
tables present them.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import write_rows
from bench.openb_trace import TraceNode, TracePod, arrival_units, fitting, jobs_of
from components.gpu_resources import WHOLE_GPU

GPU = WHOLE_GPU
GPU_COUNTS = (1, 2, 4, 8)
CURVE_COLUMNS = ("arrived", "allocated", "arrived_shared", "allocated_shared")


@dataclass(frozen=True, kw_only=True)
class JobMetrics:
    """What became of a run's jobs (pods naming a job, bench.derive_trace --jobs)."""

    jobs: int
    whole: int
    """Jobs every worker of which was bound."""
    gpus: int
    """GPUs the jobs ask for in all."""
    whole_gpus: int
    """GPUs of the jobs started whole."""
    held_end: int
    """GPUs bound to workers of jobs not started whole, at the end."""
    held_peak: int
    """The most GPUs bound at once to workers of jobs some worker of which was not yet bound,
    bindings taken in the order the watch saw them (a gang's members too are bound one after
    another)."""
    alloc_at_first_rejection: float | None
    """Allocated / total GPUs before the first single pod or job not started whole although
    the free GPUs in total were enough for it and each of its pods fits an empty node."""

    @property
    def whole_gpu_share(self) -> float:
        """The share of the jobs' GPUs that went to jobs started whole."""
        return self.whole_gpus / self.gpus if self.gpus else 0.0


def compute_job_metrics(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    placed: Sequence[str | None],
    bound_order: Sequence[int] = (),
) -> JobMetrics:
    """The jobs' metrics of one run; `pods` in arrival order (a job's workers together, as
    `arrival_order` gives them), `placed[i]` pod i's node or None, `bound_order` the pods'
    positions in the order they were seen bound (empty: unknown, the peak is then the end)."""
    if len(placed) != len(pods):
        raise ValueError(f"{len(placed)} outcomes for {len(pods)} pods")
    total = sum(n.gpus for n in nodes)
    if total <= 0:
        raise ValueError("the node list has no GPUs")
    jobs = jobs_of(pods)
    job_of = {i: job for job, members in jobs.items() for i in members}
    whole = {job for job, members in jobs.items() if all(placed[i] for i in members)}
    can_fit = fitting(pods, nodes)
    position = {id(pod): index for index, pod in enumerate(pods)}
    allocated = 0
    first: float | None = None
    for unit in arrival_units(pods):
        indices = [position[id(pod)] for pod in unit]
        demand = sum(pod.gpus for pod in unit)
        started = all(placed[i] for i in indices)
        if (
            first is None
            and not started
            and demand > 0
            and total - allocated >= demand
            and all(can_fit[i] for i in indices)
        ):
            first = allocated / total
        allocated += sum(pods[i].gpus for i in indices if placed[i])
    bound: Counter[str] = Counter()
    held = peak = 0
    for index in bound_order:
        job = job_of.get(index)
        if job is None or placed[index] is None:
            continue
        bound[job] += 1
        held += pods[index].gpus
        if bound[job] == len(jobs[job]):
            held -= sum(pods[i].gpus for i in jobs[job])
        peak = max(peak, held)
    held_end = sum(
        pods[i].gpus
        for job, members in jobs.items()
        if job not in whole
        for i in members
        if placed[i]
    )
    return JobMetrics(
        jobs=len(jobs),
        whole=len(whole),
        gpus=sum(pods[i].gpus for members in jobs.values() for i in members),
        whole_gpus=sum(pods[i].gpus for job in whole for i in jobs[job]),
        held_end=held_end,
        held_peak=max(peak, held_end),
        alloc_at_first_rejection=first,
    )


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
    jobs: JobMetrics | None = None
    """The jobs' metrics (None: the pods name no job)."""
    group_attempt_p99_s: float | None = None
    """99th percentile of the scheduler's pod group cycle latency (all results)."""
    group_attempts: int | None = None
    """Pod group cycles the scheduler ran (its histogram's count; None: no gangs)."""

    @property
    def pods_per_s(self) -> float | None:
        """Pods decided per second, from the first decision to the last."""
        return self.pods / self.scheduling_s if self.scheduling_s else None


def compute_metrics(
    profile: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    placed: Sequence[str | None],
    wall_s: float,
    out_of_order: int | None = None,
    messages: Sequence[str] | None = None,
    *,
    split_by_placement: bool = False,
) -> Metrics:
    """Metrics of one run; `placed[i]` is pod i's node, or None if it was rejected.

    `nodes` are the nodes as the scheduler saw them before the first trace pod (allocatable
    net of the system pods); `messages[i]` is a rejected pod's Unschedulable message (see
    `no_node_has_gpus`). A rejected pod that fits no empty node is counted apart, never as
    fragmentation.

    Pods are taken in trace order and never leave, so the GPUs allocated when pod i was
    decided are those of the bound pods before it.

    With `split_by_placement` a rejection is GPU-fragmented when no node had the pod's GPUs
    free, counted from those bound pods and each node's GPUs, not from the message: for GPUs
    claimed through DRA the message cannot tell (kube-scheduler reports only a node's first
    failing filter, and NodeResourcesFit's cpu and memory come before DynamicResources' devices).
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
    free_gpus = {n.name: n.gpus for n in nodes}
    for index, (pod, node) in enumerate(zip(pods, placed, strict=True)):
        arrived += pod.gpus
        arrived_shared += pod.gpu_share
        if node is not None:
            allocated += pod.gpus
            shared += pod.gpu_share
            if node in free_gpus:
                free_gpus[node] -= pod.gpus
        else:
            rejected[pod.gpus] += 1
            if pod.gpus > 0 and total - allocated >= pod.gpus and can_fit[index]:
                if first is None:
                    first = (index, pod.gpus, allocated / total, shared / total)
                no_node: bool | None = None  # None: the run cannot tell
                if split_by_placement:
                    no_node = max(free_gpus.values()) < pod.gpus
                elif messages:
                    no_node = no_node_has_gpus(messages[index])
                if no_node:
                    gpu_frag += 1
                    if first_gpu_frag is None:
                        first_gpu_frag = allocated / total
                elif no_node is not None:
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
GROUP_ATTEMPT_METRIC = "scheduler_podgroup_scheduling_attempt_duration_seconds"
"""A pod group cycle's latency, observed once per cycle (schedule_one_podgroup.go)."""
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


def attempt_mean(exposition: str, metric: str = ATTEMPT_METRIC) -> float | None:
    """The mean of one of the scheduler's latency histograms (its sum over count)."""
    total = sum(v for _, v in _samples(exposition, f"{metric}_sum"))
    count = sum(v for _, v in _samples(exposition, f"{metric}_count"))
    return total / count if count else None


def observations(exposition: str, metric: str) -> int | None:
    """How many observations a histogram of the scheduler holds; None when it has none."""
    count = sum(v for _, v in _samples(exposition, f"{metric}_count"))
    return round(count) if count else None


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
JOB_FIELDS = (
    "jobs",
    "jobs_whole",
    "job_gpus",
    "job_gpus_whole",
    "job_gpu_share_whole",
    "gpus_held_incomplete_end",
    "gpus_held_incomplete_peak",
    "alloc_at_first_rejection",
    "pods_per_s",
    "group_attempt_p99_ms",
    "group_attempts",
)
"""The CSV columns of a trace with jobs, after CSV_FIELDS."""


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
    if m.jobs is not None:
        j = m.jobs
        row |= {
            "jobs": str(j.jobs),
            "jobs_whole": str(j.whole),
            "job_gpus": str(j.gpus),
            "job_gpus_whole": str(j.whole_gpus),
            "job_gpu_share_whole": _ratio(j.whole_gpu_share),
            "gpus_held_incomplete_end": str(j.held_end),
            "gpus_held_incomplete_peak": str(j.held_peak),
            "alloc_at_first_rejection": _ratio(j.alloc_at_first_rejection),
            "pods_per_s": "" if m.pods_per_s is None else f"{m.pods_per_s:.1f}",
            "group_attempt_p99_ms": milliseconds(m.group_attempt_p99_s),
            "group_attempts": "" if m.group_attempts is None else str(m.group_attempts),
        }
    return row


def write_csv(path: Path, results: Sequence[Metrics]) -> None:
    """The runs' rows; with the columns of JOB_FIELDS when some run had jobs."""
    fields = CSV_FIELDS + (JOB_FIELDS if any(m.jobs for m in results) else ())
    write_rows(path, fields, (csv_row(m) for m in results))


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


def first_rejection_or_final(m: Metrics) -> float:
    """Allocation at the first rejection of a single pod or job that fit (JobMetrics); the
    final one if none came."""
    if m.jobs is None or m.jobs.alloc_at_first_rejection is None:
        return m.final_alloc
    return m.jobs.alloc_at_first_rejection


def job_table(results: Sequence[Metrics]) -> str:
    """A Markdown table of the runs with jobs, one row per run."""
    lines = [
        "| run | jobs started whole | their share of the jobs' GPUs "
        "| GPUs held by incomplete jobs: end / peak | alloc. at first rejection "
        "| final alloc. | pods/s | attempt p99 ms: pod / group |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        if m.jobs is None:
            continue
        j = m.jobs
        first = (
            "none" if j.alloc_at_first_rejection is None else f"{j.alloc_at_first_rejection:.1%}"
        )
        rate = "" if m.pods_per_s is None else f"{m.pods_per_s:.1f}"
        group = milliseconds(m.group_attempt_p99_s) or "-"
        lines.append(
            f"| {run_label(m)} | {j.whole} / {j.jobs} | {j.whole_gpu_share:.1%} "
            f"| {j.held_end} / {j.held_peak} | {first} | {m.final_alloc:.1%} | {rate} "
            f"| {milliseconds(m.attempt_p99_s)} / {group} |"
        )
    return "\n".join(lines)


def job_summary_table(results: Sequence[Metrics]) -> str:
    """A Markdown table of the runs with jobs: per fleet and profile, the mean over arrival
    orders (min-max), and the most GPUs incomplete jobs held in any run."""
    groups: dict[tuple[str, str], list[Metrics]] = {}
    for m in results:
        if m.jobs is not None:
            groups.setdefault((m.fleet, m.profile), []).append(m)
    lines = [
        "| fleet | profile | orders | jobs started whole | their GPU share "
        "| GPUs held by incomplete jobs, most: end / peak | alloc. at first rejection "
        "| final alloc. | pods/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (kind, profile), runs in groups.items():
        jobs = [m.jobs for m in runs if m.jobs is not None]
        whole = [j.whole for j in jobs]
        rates = [m.pods_per_s for m in runs if m.pods_per_s is not None]
        rate = f"{sum(rates) / len(rates):.1f}" if rates else ""
        lines.append(
            f"| {kind} | {profile} | {len(runs)} "
            f"| {sum(whole) / len(whole):.1f} of {jobs[0].jobs} ({min(whole)}-{max(whole)}) "
            f"| {_spread([j.whole_gpu_share for j in jobs])} "
            f"| {max(j.held_end for j in jobs)} / {max(j.held_peak for j in jobs)} "
            f"| {_spread([first_rejection_or_final(m) for m in runs])} "
            f"| {_spread([m.final_alloc for m in runs])} | {rate} |"
        )
    return "\n".join(lines)
