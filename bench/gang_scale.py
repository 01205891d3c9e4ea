"""Gangs at fleet scale: scheduling throughput with and without gangs, and one large job's time.

The cluster is bench.scheduler_scale's (the trace's node list repeated to `--nodes`, the
realistic fleet's allocatable without its DaemonSet pods, or the bare one), its API server
serving PodGroups. Per profile, with the stack's own settings (adaptive
percentageOfNodesToScore, as the stack leaves it):

- throughput: the first `--pods` pods of a trace with jobs (bench.derive_trace --jobs), each job
  a PodGroup of its workers, created pending, then drained by the scheduler (the cluster never
  fills): pods decided per second from the first decision to the last, the scheduler's attempt
  p99 per pod and per pod group cycle (scheduler_podgroup_scheduling_attempt_duration_seconds);
- one job: the pods cleared, the scheduler started and idle, then a PodGroup of `--workers`
  workers (the shape of the trace's first job with the most workers) and its pods created:
  the time from the first creation until the watch sees the last worker decided, and the
  scheduler's pod group cycle for it.

Without gangs (binpack) the same pods name the same groups, which that scheduler ignores.

    .venv/bin/python -m bench.gang_scale /tmp/openb-jobs --nodes 15000
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench import GANG_JOBS, write_rows
from bench.openb_trace import (
    DEFAULT_NODES_FILE,
    DEFAULT_PODS_FILE,
    TracePod,
    comma_choices,
    jobs_of,
    node_counts,
    read_nodes,
    read_pods,
)
from bench.replay_cluster import FLEETS, STACK_SETTINGS, JobTiming, ReplayCluster
from bench.replay_results import Metrics, milliseconds
from bench.scheduler_scale import fleet_of

PROFILES = ("binpack", "binpack-gangs", "fragmentation-gangs")
BASELINE = "binpack"
"""The profile the others' throughput is compared with (no gangs)."""
DEFAULT_CSV = GANG_JOBS / "scale.csv"
FIELDS = (
    "fleet",
    "nodes",
    "profile",
    "pods",
    "jobs",
    "scheduling_s",
    "pods_per_s",
    "p99_ms",
    "group_p99_ms",
    "group_attempts",
    "job_workers",
    "job_bound",
    "job_wall_s",
    "job_group_cycle_ms",
)


def large_job(pods: Sequence[TracePod], workers: int) -> list[TracePod]:
    """`workers` copies of the first worker of the trace's first job with the most workers,
    all in one job named `job-large`."""
    jobs = jobs_of(pods)
    if not jobs:
        raise ValueError("the pod list names no job (derive one with bench.derive_trace --jobs)")
    largest = max(jobs.values(), key=len)
    shape = pods[largest[0]]
    return [replace(shape, name=f"large-worker-{i:02d}", job="job-large") for i in range(workers)]


def row(m: Metrics, job: JobTiming) -> dict[str, str]:
    assert m.pods_per_s is not None
    return {
        "fleet": m.fleet,
        "nodes": str(m.nodes),
        "profile": m.profile,
        "pods": str(m.pods),
        "jobs": str(m.jobs.jobs if m.jobs else 0),
        "scheduling_s": f"{m.scheduling_s:.2f}",
        "pods_per_s": f"{m.pods_per_s:.1f}",
        "p99_ms": milliseconds(m.attempt_p99_s),
        "group_p99_ms": milliseconds(m.group_attempt_p99_s),
        "group_attempts": "" if m.group_attempts is None else str(m.group_attempts),
        "job_workers": str(job.workers),
        "job_bound": str(job.bound),
        "job_wall_s": f"{job.wall_s:.3f}",
        "job_group_cycle_ms": milliseconds(job.group_cycle_s),
    }


def format_table(results: Sequence[tuple[Metrics, JobTiming]]) -> str:
    """Markdown, one row per (fleet, nodes, profile); throughput against BASELINE's."""
    base = {(m.fleet, m.nodes): m.pods_per_s for m, _ in results if m.profile == BASELINE}
    lines = [
        "| fleet | nodes | profile | pods (jobs) | pods/s | vs binpack | attempt p99 ms: pod "
        "/ group | job of N workers: bound, wall s, group cycle ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, job in results:
        r = row(m, job)
        b = base.get((m.fleet, m.nodes))
        ratio = f"{m.pods_per_s / b:.2f}x" if b and m.pods_per_s else ""
        lines.append(
            f"| {m.fleet} | {m.nodes:,} | {m.profile} | {m.pods:,} ({r['jobs']}) "
            f"| {r['pods_per_s']} | {ratio} | {r['p99_ms']} / {r['group_p99_ms'] or '-'} "
            f"| {job.bound}/{job.workers}, {job.wall_s:.2f}, {r['job_group_cycle_ms'] or '-'} |"
        )
    return "\n".join(lines)


def write_csv(path: Path, results: Sequence[tuple[Metrics, JobTiming]]) -> None:
    write_rows(path, FIELDS, (row(m, job) for m, job in results))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="trace directory with a job column")
    parser.add_argument("--nodes", default="15000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=4000, help="the trace's first N pods")
    parser.add_argument("--workers", type=int, default=16, help="workers of the timed job")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated")
    parser.add_argument(
        "--fleets", default="realistic", help=f"comma-separated: {','.join(FLEETS)}"
    )
    parser.add_argument(
        "--csv", type=Path, default=DEFAULT_CSV, help="CSV to write (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=16, help="parallel object creation")
    args = parser.parse_args(argv)
    counts = node_counts(parser, args.nodes)
    for flag, value, low in (("--pods", args.pods, 1), ("--workers", args.workers, 2)):
        if value < low:
            parser.error(f"{flag} {value}: expected an integer >= {low}")
    profiles = comma_choices(parser, "--profiles", args.profiles, tuple(STACK_SETTINGS))
    fleets = comma_choices(parser, "--fleets", args.fleets, FLEETS)
    trace_nodes = read_nodes(args.trace / DEFAULT_NODES_FILE)
    all_pods = read_pods(args.trace / DEFAULT_PODS_FILE)
    try:
        job = large_job(all_pods, args.workers)
    except ValueError as exc:
        parser.error(f"{args.trace / DEFAULT_PODS_FILE}: {exc}")
    pods = all_pods[: args.pods]
    results: list[tuple[Metrics, JobTiming]] = []
    for kind, count in itertools.product(fleets, counts):
        nodes = fleet_of(trace_nodes, count)
        with ReplayCluster(
            nodes, fleet=kind, daemonsets=False, gangs=True, threads=args.threads
        ) as cluster:
            for profile in profiles:
                settings = STACK_SETTINGS[profile]()
                m = cluster.run(profile, pods, settings=settings, score_all=False)
                timing = cluster.time_job(profile, job, settings=settings)
                results.append((m, timing))
                write_csv(args.csv, results)
    print()
    print(format_table(results))
    print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
