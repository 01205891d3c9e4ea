"""Derive another trace in the openb format: heavier cpu or memory requests, more multi-GPU pods.

The node list is copied unchanged; in the pod list, the GPU pods' (num_gpu > 0 or gpu_milli > 0)
cpu_milli and memory_mib are multiplied by --cpu-scale and --memory-scale and rounded to whole
units, capped at the most a node with the pod's GPUs offers; with --multi-gpu-share P, each
whole 1-GPU pod takes, with probability P (seeded by --seed), the shape (GPUs, cpu, memory) of a
multi-GPU pod of the trace drawn at random, keeping its name and time. With --jobs (after the
two above, seeded by --seed too), the multi-GPU pods become the workers of distributed jobs
(`group_jobs`): in trace order, each pod joins the open job of its shape (GPUs, cpu, memory),
a job taking 2 to 16 workers (drawn at random when it opens); a job's workers move up to its
first worker's row and time (a job is submitted whole), named in a new `job` column; a job
left with one worker at the end is a single pod again, and every other pod stays single.
Otherwise every other column and the row order stay as they are. The output directory is a trace
directory `bench.openb_replay` and `bench.binpack_sweep` read as they read the public one (it
holds data derived from the trace, so keep it out of the repository).

    .venv/bin/python -m bench.derive_trace ../shared/traces/openb /tmp/openb-cpu1.5 --cpu-scale 1.5
    .venv/bin/python -m bench.derive_trace ../shared/traces/openb /tmp/openb-multi --multi-gpu-share 0.1
    .venv/bin/python -m bench.derive_trace ../shared/traces/openb /tmp/openb-jobs \
        --multi-gpu-share 0.1 --jobs --seed 1
"""

from __future__ import annotations

import argparse
import csv
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import write_rows
from bench.openb_trace import (
    DEFAULT_NODES_FILE,
    DEFAULT_PODS_FILE,
    JOB_COLUMN,
    POD_COLUMNS,
    TraceError,
    TraceNode,
    gpu_request,
    read_nodes,
)


def scale_row(
    row: dict[str, str], cpu_scale: float, memory_scale: float, nodes: Sequence[TraceNode]
) -> dict[str, str]:
    """`row` with a GPU pod's cpu_milli and memory_mib scaled (CPU-only pods unchanged).

    A scaled request is capped at the most any node with the pod's GPUs offers, so every pod
    that fit some empty node still does (a pod no node can hold is no test of packing).
    """
    gpus = gpu_request(int(row["num_gpu"] or 0), int(row["gpu_milli"] or 0))
    if gpus == 0:
        return row
    able = [n for n in nodes if n.gpus >= gpus] or list(nodes)
    cpu, memory = int(row["cpu_milli"]), int(row["memory_mib"])
    return {
        **row,
        "cpu_milli": str(max(cpu, min(round(cpu * cpu_scale), max(n.cpu_milli for n in able)))),
        "memory_mib": str(
            max(memory, min(round(memory * memory_scale), max(n.memory_mib for n in able)))
        ),
    }


SHAPE_COLUMNS = ("num_gpu", "gpu_milli", "cpu_milli", "memory_mib")


def more_multi_gpu(rows: Sequence[dict[str, str]], share: float, seed: int) -> list[dict[str, str]]:
    """`rows` with a `share` of the whole 1-GPU pods given a multi-GPU pod's shape."""
    shapes = [{c: row[c] for c in SHAPE_COLUMNS} for row in rows if int(row["num_gpu"] or 0) > 1]
    if share and not shapes:
        raise ValueError("the trace has no multi-GPU pod to copy")
    rng = random.Random(seed)
    out = []
    for row in rows:
        whole_one = row["num_gpu"] == "1" and int(row["gpu_milli"] or 0) >= 1000
        if whole_one and rng.random() < share:
            row = {**row, **rng.choice(shapes)}
        out.append(row)
    return out


JOB_WORKERS = (2, 16)
"""The fewest and most workers of a derived job."""


def group_jobs(
    rows: Sequence[dict[str, str]], seed: int, workers: tuple[int, int] = JOB_WORKERS
) -> list[dict[str, str]]:
    """`rows` with the multi-GPU pods grouped into jobs of one shape, a `job` column added.

    In row order, a multi-GPU pod (num_gpu > 1) joins the open job of its shape
    (SHAPE_COLUMNS); a job opens with a size drawn from `workers` (seeded) and closes when it
    has that many. Jobs are named job-00000, ... in the order of their first worker, whose
    row and creation_time their other workers take; a job left with one worker is a single
    pod, every other pod keeps its row with an empty `job`.
    """
    low, high = workers
    if not 2 <= low <= high:
        raise ValueError(f"job workers {low}-{high}: expected 2 <= fewest <= most")
    rng = random.Random(seed)
    open_jobs: dict[tuple[str, ...], list[int]] = {}
    sizes: dict[int, int] = {}
    jobs: list[list[int]] = []
    for index, row in enumerate(rows):
        if int(row["num_gpu"] or 0) <= 1:
            continue
        shape = tuple(row[c] for c in SHAPE_COLUMNS)
        job = open_jobs.get(shape)
        if job is None:
            job = open_jobs[shape] = [index]
            sizes[index] = rng.randint(low, high)
            jobs.append(job)
        else:
            job.append(index)
        if len(job) == sizes[job[0]]:
            del open_jobs[shape]
    first_of: dict[int, tuple[str, list[int]]] = {}
    in_job: set[int] = set()
    for members in (j for j in jobs if len(j) > 1):
        first_of[members[0]] = (f"job-{len(first_of):05d}", members)
        in_job.update(members)
    out = []
    for index, row in enumerate(rows):
        if index in first_of:
            name, members = first_of[index]
            for member in members:
                out.append(
                    {
                        **rows[member],
                        "creation_time": row["creation_time"],
                        JOB_COLUMN: name,
                    }
                )
        elif index not in in_job:
            out.append({**row, JOB_COLUMN: ""})
    return out


def derive(
    source: Path,
    target: Path,
    *,
    cpu_scale: float = 1.0,
    memory_scale: float = 1.0,
    multi_gpu_share: float = 0.0,
    jobs: bool = False,
    seed: int = 1,
    pods_file: str = DEFAULT_PODS_FILE,
    nodes_file: str = DEFAULT_NODES_FILE,
) -> Path:
    """Write the derived trace directory `target`; returns its pod list."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / nodes_file, target / DEFAULT_NODES_FILE)
    with (source / pods_file).open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = list(reader.fieldnames or [])
        missing = [c for c in POD_COLUMNS if c not in fields]
        if missing:
            raise TraceError(f"{source / pods_file}: missing column(s) {', '.join(missing)}")
        nodes = read_nodes(source / nodes_file)
        rows = more_multi_gpu(list(reader), multi_gpu_share, seed)
        rows = [scale_row(row, cpu_scale, memory_scale, nodes) for row in rows]
    if jobs:
        if JOB_COLUMN in fields:
            raise TraceError(f"{source / pods_file}: already has a {JOB_COLUMN!r} column")
        rows = group_jobs(rows, seed)
        fields.append(JOB_COLUMN)
    out = target / DEFAULT_PODS_FILE
    write_rows(out, fields, rows)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="source trace directory")
    parser.add_argument("target", type=Path, help="directory to write the derived trace to")
    parser.add_argument("--cpu-scale", type=float, default=1.0, help="GPU pods' cpu factor")
    parser.add_argument("--memory-scale", type=float, default=1.0, help="GPU pods' memory factor")
    parser.add_argument(
        "--multi-gpu-share", type=float, default=0.0, help="1-GPU pods made multi-GPU (0-1)"
    )
    parser.add_argument(
        "--jobs",
        action="store_true",
        help="group multi-GPU pods of one shape into jobs of 2-16 workers (a job column)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of --multi-gpu-share, --jobs")
    parser.add_argument("--pods-file", default=DEFAULT_PODS_FILE, help="pod list in trace")
    parser.add_argument("--nodes-file", default=DEFAULT_NODES_FILE, help="node list in trace")
    args = parser.parse_args(argv)
    for flag, value in (("--cpu-scale", args.cpu_scale), ("--memory-scale", args.memory_scale)):
        if not 0 < value <= 10:
            parser.error(f"{flag} {value}: expected a factor above 0 and at most 10")
    if not 0 <= args.multi_gpu_share <= 1:
        parser.error(f"--multi-gpu-share {args.multi_gpu_share}: expected a share from 0 to 1")
    if args.target.resolve() == args.trace.resolve():
        parser.error(f"target {args.target}: expected a directory other than the source trace")
    try:
        out = derive(
            args.trace,
            args.target,
            cpu_scale=args.cpu_scale,
            memory_scale=args.memory_scale,
            multi_gpu_share=args.multi_gpu_share,
            jobs=args.jobs,
            seed=args.seed,
            pods_file=args.pods_file,
            nodes_file=args.nodes_file,
        )
    except (OSError, TraceError, ValueError) as exc:
        parser.error(str(exc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
