"""bench/binpack_sweep.py and bench/derive_trace.py: the sweep's points, its Pareto front and
choice, and the derived trace, on hand-made metrics and rows (the sweep itself runs by hand)."""

from __future__ import annotations

import csv
from pathlib import Path

from bench.binpack_sweep import POINTS, best, format_table, knobs, pareto, write_csv
from bench.derive_trace import derive, more_multi_gpu, scale_row
from bench.openb_trace import TraceNode, read_pods
from bench.replay_results import Metrics
from components.binpack_scheduler.manifests import render_config


def _metrics(label: str, first: float | None, final: float, large: int = 0) -> Metrics:
    return Metrics(
        profile=label,
        nodes=1,
        total_gpus=8,
        pods=10,
        bound=9,
        first_frag_index=None if first is None else 5,
        first_frag_gpus=None if first is None else 8,
        alloc_at_first_frag=first,
        alloc_at_first_gpu_frag=None,
        rejected_gpu_frag=0,
        rejected_stranded=0,
        final_alloc=final,
        rejected_by_gpus={8: large} if large else {},
        wall_s=1.0,
    )


def test_sweep_every_point_is_valid_stack_config_and_renders() -> None:
    labels = [p.label for p in POINTS]
    assert len(labels) == len(set(labels))
    for point in POINTS:
        render_config(point.settings().profile)


def test_sweep_pareto_keeps_only_undominated_points() -> None:
    results = [
        _metrics("spread", 0.23, 0.99, large=22),
        _metrics("pack", 0.76, 0.97, large=5),
        _metrics("dominated", 0.70, 0.96, large=6),
        _metrics("never-fragments", None, 0.95, large=9),
    ]
    assert pareto(results) == [True, True, False, True]


def test_sweep_best_meets_the_final_allocation_goal_before_fragmentation() -> None:
    reference = _metrics("default", 0.23, 0.992, large=30)
    packs_more_but_loses = _metrics("a", 0.90, 0.980)
    within_half_a_point = _metrics("b", 0.80, 0.988)
    assert best([packs_more_but_loses, within_half_a_point], reference) is within_half_a_point
    bal1 = next(p for p in POINTS if p.label == "bal1")
    rows = [(reference, None), (packs_more_but_loses, POINTS[0].scheduler)]
    rows.append((within_half_a_point, bal1.scheduler))
    table = format_table(rows, reference)
    assert "| b | gpu:100 cpu:1 memory:1 | 0->0 100->10 | 1 x cpu,memory,gpu | 100 " in table
    assert table.splitlines()[-1].endswith("| 80.0% | 98.8% | 0/0 | yes (best) | 1 |")


def test_sweep_knobs_name_adaptive_sampling(tmp_path: Path) -> None:
    adaptive = next(p for p in POINTS if "percentageOfNodesToScore" not in p.scheduler)
    assert knobs(adaptive.scheduler)["pct"] == "adaptive"
    out = tmp_path / "sweep.csv"
    write_csv(
        out, [(_metrics("default", None, 1.0), None), (_metrics("x", 0.5, 0.9), adaptive.scheduler)]
    )
    rows = list(csv.DictReader(out.open()))
    assert [(r["point"], r["pareto"]) for r in rows] == [("default", "true"), ("x", "false")]


NODES = [
    TraceNode(name="small", cpu_milli=96000, memory_mib=393216, gpus=8),
    TraceNode(name="big", cpu_milli=16000, memory_mib=131072, gpus=2),
]


def test_derive_trace_scales_gpu_pods_only() -> None:
    gpu = {"cpu_milli": "6000", "memory_mib": "12288", "num_gpu": "0", "gpu_milli": "460"}
    cpu_only = {"cpu_milli": "6000", "memory_mib": "100", "num_gpu": "0", "gpu_milli": "0"}
    assert scale_row(gpu, 1.5, 2, NODES) == {**gpu, "cpu_milli": "9000", "memory_mib": "24576"}
    assert scale_row(cpu_only, 1.5, 2, NODES) == cpu_only


def test_derive_trace_caps_a_request_at_the_largest_node_with_its_gpus() -> None:
    row = {"cpu_milli": "88000", "memory_mib": "327680", "num_gpu": "8", "gpu_milli": "1000"}
    scaled = scale_row(row, 1.5, 1.5, NODES)
    assert (scaled["cpu_milli"], scaled["memory_mib"]) == ("96000", "393216")


def test_derive_trace_writes_a_trace_the_replay_reads(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu\nn,8000,100,8\n"
    )
    (source / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,qos\n"
        "a,1000,10,1,1000,5,LS\nb,333,10,0,0,1,BE\n"
    )
    out = derive(source, tmp_path / "out", cpu_scale=1.5)
    pods = read_pods(out)
    assert [(p.name, p.cpu_milli) for p in pods] == [("b", 333), ("a", 1500)]
    assert "qos" in out.read_text().splitlines()[0]


def _row(name: str, gpus: int, milli: int = 1000, cpu: int = 4000) -> dict[str, str]:
    return {
        "name": name,
        "num_gpu": str(gpus),
        "gpu_milli": str(milli if gpus else 0),
        "cpu_milli": str(cpu),
        "memory_mib": "8192",
        "creation_time": "0",
    }


def test_derive_trace_more_multi_gpu_turns_only_whole_one_gpu_pods_into_copied_shapes() -> None:
    rows = [
        _row("big", 8, cpu=64000),
        *(_row(f"one{i}", 1) for i in range(200)),
        _row("shared", 1, milli=300),
        _row("cpu", 0),
    ]
    out = more_multi_gpu(rows, 0.25, seed=3)
    assert more_multi_gpu(rows, 0.25, seed=3) == out
    changed = [r for r, o in zip(rows, out, strict=True) if r != o]
    assert 30 <= len(changed) <= 70
    assert all(r["name"].startswith("one") for r in changed)
    assert all(
        (o["num_gpu"], o["cpu_milli"], o["name"]) == ("8", "64000", r["name"])
        for r, o in zip(rows, out, strict=True)
        if r != o
    )
    assert more_multi_gpu(rows, 0.0, seed=3) == rows
