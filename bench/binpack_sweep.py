"""Sweep the binpack profile's scoring knobs over the openb trace with the real kube-scheduler.

Each point is a `scheduler` section of the stack config (camelCase keys, validated by the
stack's own settings model and rendered by `render_config`, as a deployment would be), replayed
by `bench.openb_replay` in one control plane (pods deleted and re-created between points), plus
the stock default-scheduler as the reference. Prints every point's knobs and metrics, marks the
Pareto-optimal ones (higher allocation at the first fragmentation rejection, higher final
allocation, fewer 4/8-GPU pods rejected) and the best point by the goal's order (final
allocation within 0.5 point of default and large-pod rejections no more than default first,
then allocation at the first fragmentation rejection), and writes a CSV.

    .venv/bin/python -m bench.binpack_sweep ../shared/traces/openb
    .venv/bin/python -m bench.binpack_sweep ../shared/traces/openb --points base,probe --limit 500
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import SCHEDULER_DEFAULTS, write_rows
from bench.openb_trace import add_trace_arguments, load_trace
from bench.replay_cluster import BENCH_IMAGE, ReplayCluster
from bench.replay_results import CSV_FIELDS, Metrics, csv_row
from components.binpack_scheduler.manifests import FRAGMENTATION_PLUGIN
from components.binpack_scheduler.settings import FRAGMENTATION
from stack_config import SchedulerConfig

DEFAULT_CSV = SCHEDULER_DEFAULTS / "sweep.csv"
TODAY = {"resourceWeights": {"nvidia.com/gpu": 100, "cpu": 1, "memory": 1}}
KUBE_BALANCED = {"weight": 1, "resources": ["cpu", "memory"]}
BALANCED_GPU = ["cpu", "memory", "nvidia.com/gpu"]


@dataclass(frozen=True, kw_only=True)
class Point:
    label: str
    scheduler: Mapping[str, Any]
    """The stack config's `scheduler` section for this point."""

    def settings(self) -> SchedulerConfig:
        return SchedulerConfig.model_validate(dict(self.scheduler))


def _point(label: str, *, pct: int | None = 100, **scheduler: Any) -> Point:
    section = {**TODAY, **scheduler}
    if pct is not None:
        section["percentageOfNodesToScore"] = pct
    return Point(label=label, scheduler=section)


def _balanced(weight: int, resources: Sequence[str] = BALANCED_GPU) -> dict[str, Any]:
    return {"weight": weight, "resources": list(resources)}


LINEAR = [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]
CONVEX = [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 2}, *LINEAR[1:]]
CONCAVE = [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 8}, *LINEAR[1:]]

# In the order they are run: the most telling first, so a sweep cut short still answers.
POINTS = (
    # The profile before the sweep: kube-scheduler's own BalancedAllocation (cpu, memory, 1).
    _point("base", balancedAllocation=KUBE_BALANCED),
    # The first probe of the issue.
    _point("bal3", balancedAllocation=_balanced(3)),
    _point("bal10", balancedAllocation=_balanced(10)),
    _point(
        "bal3-cm10",
        balancedAllocation=_balanced(3),
        resourceWeights={"nvidia.com/gpu": 100, "cpu": 10, "memory": 10},
    ),
    _point("bal3-gpuonly", balancedAllocation=_balanced(3), resourceWeights={"nvidia.com/gpu": 1}),
    _point("bal1", balancedAllocation=_balanced(1)),
    _point("bal6", balancedAllocation=_balanced(6)),
    _point(
        "bal10-cm10",
        balancedAllocation=_balanced(10),
        resourceWeights={"nvidia.com/gpu": 100, "cpu": 10, "memory": 10},
    ),
    _point("bal3-adaptive", pct=None, balancedAllocation=_balanced(3)),
    _point("base-adaptive", pct=None, balancedAllocation=KUBE_BALANCED),
    _point("bal20", balancedAllocation=_balanced(20)),
    _point("bal3-convex", balancedAllocation=_balanced(3), shape=CONVEX),
    _point("bal3-concave", balancedAllocation=_balanced(3), shape=CONCAVE),
    _point(
        "bal3-cm50",
        balancedAllocation=_balanced(3),
        resourceWeights={"nvidia.com/gpu": 100, "cpu": 50, "memory": 50},
    ),
    # scoring: fragmentation (the GpuFragmentation plugin, scheduler/), every node scored or the
    # adaptive sample the stack leaves by default.
    Point(
        label="frag",
        scheduler={"scoring": FRAGMENTATION, "image": BENCH_IMAGE, "percentageOfNodesToScore": 100},
    ),
    Point(label="frag-adaptive", scheduler={"scoring": FRAGMENTATION, "image": BENCH_IMAGE}),
)


def large_rejected(m: Metrics) -> int:
    return m.rejected_by_gpus.get(4, 0) + m.rejected_by_gpus.get(8, 0)


def _key(m: Metrics) -> tuple[float, float, int]:
    return (m.alloc_at_first_frag or 1.0, m.final_alloc, -large_rejected(m))


def pareto(results: Sequence[Metrics]) -> list[bool]:
    """Whether each result is not dominated by another (all three measures at least as good)."""
    keys = [_key(m) for m in results]
    return [
        not any(
            other != mine and all(o >= s for o, s in zip(other, mine, strict=True))
            for other in keys
        )
        for mine in keys
    ]


def best(results: Sequence[Metrics], reference: Metrics) -> Metrics:
    """The best point by the goal's order, against the default scheduler's run."""

    def rank(m: Metrics) -> tuple[bool, bool, float, float]:
        return (
            m.final_alloc >= reference.final_alloc - 0.005,
            large_rejected(m) <= large_rejected(reference),
            m.alloc_at_first_frag or 1.0,
            m.final_alloc,
        )

    return max(results, key=rank)


def knobs(scheduler: Mapping[str, Any] | None) -> dict[str, str]:
    """The swept knobs of a point as short CSV/table cells ('' for default-scheduler)."""
    if scheduler is None:
        return {"weights": "", "shape": "", "balanced": "", "pct": "100"}
    pct = str(scheduler.get("percentageOfNodesToScore", "adaptive"))
    if scheduler.get("scoring") == FRAGMENTATION:
        return {"weights": FRAGMENTATION_PLUGIN, "shape": "", "balanced": "", "pct": pct}
    weights = scheduler["resourceWeights"]
    shape = scheduler.get("shape", LINEAR)
    balanced = scheduler.get("balancedAllocation", {})
    return {
        "weights": " ".join(f"{k.removeprefix('nvidia.com/')}:{v}" for k, v in weights.items()),
        "shape": " ".join(f"{p['utilization']}->{p['score']}" for p in shape),
        "balanced": (
            f"{balanced.get('weight')} x "
            + ",".join(r.removeprefix("nvidia.com/") for r in balanced.get("resources", []))
        ),
        "pct": pct,
    }


def format_table(
    rows: Sequence[tuple[Metrics, Mapping[str, Any] | None]], reference: Metrics
) -> str:
    front = pareto([m for m, _ in rows])
    chosen = best([m for m, s in rows if s is not None], reference)
    lines = [
        "| point | RTCR weights | shape | BalancedAllocation (weight x resources) | % scored "
        "| alloc. at first frag. | final alloc. | rejected 4/8-GPU | Pareto | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (m, scheduler), on_front in zip(rows, front, strict=True):
        k = knobs(scheduler)
        frag = "none" if m.alloc_at_first_frag is None else f"{m.alloc_at_first_frag:.1%}"
        mark = "yes" if on_front else ""
        if m is chosen:
            mark += " (best)"
        lines.append(
            f"| {m.profile} | {k['weights']} | {k['shape']} | {k['balanced']} | {k['pct']} "
            f"| {frag} | {m.final_alloc:.1%} "
            f"| {m.rejected_by_gpus.get(4, 0)}/{m.rejected_by_gpus.get(8, 0)} | {mark.strip()} "
            f"| {m.wall_s:.0f} |"
        )
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[tuple[Metrics, Mapping[str, Any] | None]]) -> None:
    front = pareto([m for m, _ in rows])
    fields = ["point", "weights", "shape", "balanced", "pareto", *CSV_FIELDS]

    def row(m: Metrics, scheduler: Mapping[str, Any] | None, on_front: bool) -> dict[str, str]:
        k = knobs(scheduler)
        cells = {"weights": k["weights"], "shape": k["shape"], "balanced": k["balanced"]}
        return {"point": m.profile, **cells, "pareto": str(on_front).lower(), **csv_row(m)}

    write_rows(path, fields, (row(m, s, f) for (m, s), f in zip(rows, front, strict=True)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_arguments(parser, DEFAULT_CSV)
    parser.add_argument(
        "--points",
        help=f"comma-separated subset of: {', '.join(p.label for p in POINTS)} (default: all)",
    )
    args = parser.parse_args(argv)
    points = list(POINTS)
    if args.points:
        wanted = [w.strip() for w in args.points.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {p.label for p in POINTS}]
        if unknown or not wanted:
            parser.error(
                f"--points {args.points!r}: expected some of {', '.join(p.label for p in POINTS)}"
            )
        points = [p for p in POINTS if p.label in wanted]
    nodes, pods = load_trace(parser, args)
    settings = [p.settings() for p in points]  # a bad point fails here, before any run
    rows: list[tuple[Metrics, Mapping[str, Any] | None]] = []
    with ReplayCluster(nodes) as cluster:
        reference = cluster.run("default", pods)
        rows.append((reference, None))
        for point, point_settings in zip(points, settings, strict=True):
            profile = "fragmentation" if point_settings.scoring == FRAGMENTATION else "binpack"
            metrics = cluster.run(profile, pods, settings=point_settings)
            rows.append((replace(metrics, profile=point.label), point.scheduler))
            print(format_table(rows, reference), flush=True)
            write_csv(args.csv, rows)  # after every point: a sweep cut short keeps its rows
    print()
    print(format_table(rows, reference))
    write_csv(args.csv, rows)
    print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
