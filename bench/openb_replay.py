"""Replay the openb GPU trace through the real kube-scheduler, one profile after another.

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
trace nodes are GPU nodes, CPU-only pods included). No pod departs. The profiles: default,
mostallocated (MostAllocated bin packing), binpack (the stack's) and fragmentation, and for a
trace with jobs (bench.derive_trace --jobs) binpack-gangs and fragmentation-gangs, the same
with scheduler.gangScheduling: a job's workers then arrive together (a shuffle moves the job
as one), each job is a PodGroup of all its workers, and the jobs' metrics (jobs started
whole, GPUs held by incomplete jobs, allocation at the first rejection of a pod or job that
fit) are added to the table and the CSV (default there: bench/results/gang-jobs/replay.csv).

Ordering: pods are created before the scheduler starts, named in trace order; the scheduler's
first LIST (a plain LIST: its streaming list is turned off) returns them sorted by name, so its
FIFO queue holds them in trace order. The
scheduler's own log (-v=3, "Attempting to schedule pod") is checked for that order and the
number of first attempts out of order is reported. With no departures, the pods bound before
pod i are then exactly the bound pods that precede it in the trace, which is what the
metrics use.

    .venv/bin/python -m bench.openb_replay ../shared/traces/openb
    .venv/bin/python -m bench.openb_replay ../shared/traces/openb --limit 500 --node-limit 100
    .venv/bin/python -m bench.openb_replay /tmp/openb-jobs \
        --profiles default,binpack,binpack-gangs,fragmentation-gangs

With --dra the nodes' GPUs are devices of ResourceSlices and the GPU pods claim them through
ResourceClaims (bench/dra.py; default CSV: bench/results/dra-replay/replay.csv).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from bench import DRA_REPLAY, GANG_JOBS, OPENB_FRAGMENTATION
from bench.openb_trace import (
    add_trace_arguments,
    arrival_order,
    comma_choices,
    jobs_of,
    load_trace,
)
from bench.replay_cluster import ALL_PROFILES, FLEETS, GANG_PROFILES, PROFILES, ReplayCluster
from bench.replay_results import (
    format_table,
    job_summary_table,
    job_table,
    summary_table,
    write_csv,
    write_curves,
)

DEFAULT_CSV = OPENB_FRAGMENTATION / "replay.csv"
JOBS_CSV = GANG_JOBS / "replay.csv"
"""The default CSV of a trace with jobs."""
DRA_CSV = DRA_REPLAY / "replay.csv"
"""The default CSV with --dra."""


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
        "--profiles",
        default=",".join(PROFILES),
        help=f"comma-separated: {','.join(ALL_PROFILES)} (the gang ones need a trace with jobs)",
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
    parser.add_argument(
        "--dra",
        action="store_true",
        help="GPUs as ResourceSlice devices, claimed through ResourceClaims (bench/dra.py)",
    )
    args = parser.parse_args(argv)
    profiles = comma_choices(parser, "--profiles", args.profiles, ALL_PROFILES)
    fleets = comma_choices(parser, "--fleets", args.fleets, FLEETS)
    orders = _orders(parser, args.orders)
    for flag, value in (("--repeat", args.repeat), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    nodes, pods = load_trace(parser, args)
    jobs = bool(jobs_of(pods))
    gang = [p for p in profiles if p in GANG_PROFILES]
    if gang and not jobs:
        parser.error(
            f"--profiles {','.join(gang)}: the pod list {args.pods_file} names no job "
            "(derive one with python -m bench.derive_trace --jobs)"
        )
    if args.dra and (jobs or gang):
        parser.error("--dra: the replay of jobs and the gang profiles run only without --dra")
    if jobs and args.csv == DEFAULT_CSV:
        args.csv = JOBS_CSV
    if args.dra and args.csv == DEFAULT_CSV:
        args.csv = DRA_CSV
    results = []
    for kind in fleets:
        with ReplayCluster(
            nodes,
            fleet=kind,
            seed=args.fleet_seed,
            gangs=jobs,
            dra=args.dra,
            threads=args.threads,
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
    if jobs:
        print()
        print(job_table(results))
        print()
        print(job_summary_table(results))
    curves = args.csv.with_suffix(".curve.csv")
    write_curves(curves, results)
    print(f"\nwrote {args.csv} and {curves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
