"""Scheduling throughput and latency of default, binpack and fragmentation at fleet scale.

The openb trace's node list is repeated until the cluster has the asked number of nodes
(`scale-node-NNNNN`, each a copy of trace node i mod 1,213), with allocatable as kubelets
report it (`--fleets realistic`, the default: bench/fleet.py's realistic fleet, without its
DaemonSet pods: at 15,000 nodes those would be 75,000 pods for the 2-core machine to bind
before the measurement) or the trace's capacity (`--fleets bare`). The first
`--pods` pods of the trace are created pending, then one kube-scheduler per profile is started
with the stack's own settings (kube-scheduler's adaptive percentageOfNodesToScore, as the stack
leaves it) and drains them. The cluster never fills up, so every pod is scheduled.

- throughput: pods decided / seconds from the first decision to the last, as a watch on the
  pods sees them;
- attempt p99 / mean: the scheduler's own histogram
  (scheduler_scheduling_attempt_duration_seconds: the algorithm and the binding, which waits
  on the API server), and algorithm p99 (scheduler_scheduling_algorithm_duration_seconds:
  filter and score alone), read from its /metrics at the end; a p99 is interpolated inside
  the histogram's buckets (factor-2 wide), as PromQL's histogram_quantile does.

Nodes are plain Node objects with a Ready condition: nothing here needs kwok's heartbeats or
pod status, and the scheduler sees the same objects either way.

    .venv/bin/python -m bench.scheduler_scale ../shared/traces/openb --nodes 1213,5000,15000
    .venv/bin/python -m bench.scheduler_scale ../shared/traces/openb --fleets bare,realistic

With --dra the nodes' GPUs are devices of ResourceSlices and the GPU pods claim them through
ResourceClaims (bench/dra.py; default CSV: bench/results/dra-replay/throughput.csv); the time
kube-controller-manager takes to make the claims comes before the scheduler starts and is not
counted.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench import DRA_REPLAY, SCHEDULER_THROUGHPUT, write_rows
from bench.openb_trace import (
    DEFAULT_NODES_FILE,
    DEFAULT_PODS_FILE,
    TraceNode,
    comma_choices,
    node_counts,
    read_nodes,
    read_pods,
)
from bench.replay_cluster import FLEETS, STACK_SETTINGS, ReplayCluster
from bench.replay_results import Metrics, milliseconds

PROFILES = ("default", "binpack", "fragmentation")
DEFAULT_CSV = SCHEDULER_THROUGHPUT / "throughput.csv"
DRA_CSV = DRA_REPLAY / "throughput.csv"
"""The default CSV with --dra."""
FIELDS = (
    "fleet",
    "nodes",
    "profile",
    "pods",
    "scheduling_s",
    "pods_per_s",
    "p99_ms",
    "mean_ms",
    "algorithm_p99_ms",
)


def fleet_of(nodes: Sequence[TraceNode], count: int) -> list[TraceNode]:
    """`count` nodes, node i a copy of `nodes[i % len(nodes)]`."""
    return [replace(nodes[i % len(nodes)], name=f"scale-node-{i:05d}") for i in range(count)]


def throughput(m: Metrics) -> float:
    assert m.scheduling_s is not None
    return m.pods / m.scheduling_s


def row(m: Metrics) -> dict[str, str]:
    return {
        "fleet": m.fleet,
        "nodes": str(m.nodes),
        "profile": m.profile,
        "pods": str(m.pods),
        "scheduling_s": f"{m.scheduling_s:.2f}",
        "pods_per_s": f"{throughput(m):.1f}",
        "p99_ms": milliseconds(m.attempt_p99_s),
        "mean_ms": milliseconds(m.attempt_mean_s),
        "algorithm_p99_ms": milliseconds(m.algorithm_p99_s),
    }


def format_table(results: Sequence[Metrics]) -> str:
    """Markdown, one row per (fleet, nodes, profile); each throughput against binpack's."""
    binpack = {(m.fleet, m.nodes): throughput(m) for m in results if m.profile == "binpack"}
    lines = [
        "| fleet | nodes | profile | pods | pods/s | vs binpack | attempt p99 ms "
        "| attempt mean ms | algorithm p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        r = row(m)
        base = binpack.get((m.fleet, m.nodes))
        ratio = f"{throughput(m) / base:.2f}x" if base else ""
        lines.append(
            f"| {m.fleet} | {m.nodes:,} | {m.profile} | {m.pods:,} | {r['pods_per_s']} | {ratio} "
            f"| {r['p99_ms']} | {r['mean_ms']} | {r['algorithm_p99_ms']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="trace directory (e.g. ../shared/traces/openb)")
    parser.add_argument("--nodes", default="1213,5000,15000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=4000, help="the trace's first N pods")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated")
    parser.add_argument(
        "--fleets",
        default="realistic",
        help=f"comma-separated: {','.join(FLEETS)} (allocatable as in bench/fleet.py or bare)",
    )
    parser.add_argument(
        "--csv", type=Path, default=DEFAULT_CSV, help="CSV to write (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=16, help="parallel object creation")
    parser.add_argument(
        "--dra",
        action="store_true",
        help="GPUs as ResourceSlice devices, claimed through ResourceClaims (bench/dra.py)",
    )
    args = parser.parse_args(argv)
    if args.dra and args.csv == DEFAULT_CSV:
        args.csv = DRA_CSV
    counts = node_counts(parser, args.nodes)
    profiles = comma_choices(parser, "--profiles", args.profiles, PROFILES)
    fleets = comma_choices(parser, "--fleets", args.fleets, FLEETS)
    if args.pods < 1:
        parser.error(f"--pods {args.pods}: expected an integer >= 1")
    trace_nodes = read_nodes(args.trace / DEFAULT_NODES_FILE)
    pods = read_pods(args.trace / DEFAULT_PODS_FILE)[: args.pods]
    results: list[Metrics] = []
    for kind, count in itertools.product(fleets, counts):
        nodes = fleet_of(trace_nodes, count)
        with ReplayCluster(
            nodes, fleet=kind, daemonsets=False, dra=args.dra, threads=args.threads
        ) as cluster:
            for profile in profiles:
                settings = STACK_SETTINGS[profile]() if profile in STACK_SETTINGS else None
                results.append(cluster.run(profile, pods, settings=settings, score_all=False))
                write_csv(args.csv, results)
    print()
    print(format_table(results))
    print(f"\nwrote {args.csv}")
    return 0


def write_csv(path: Path, results: Sequence[Metrics]) -> None:
    write_rows(path, FIELDS, (row(m) for m in results))


if __name__ == "__main__":
    sys.exit(main())
