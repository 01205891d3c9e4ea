"""bench/scheduler_scale.py: the repeated fleet and the throughput table, on made-up runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.openb_trace import TraceNode, TracePod
from bench.replay_results import compute_metrics
from bench.scheduler_scale import fleet_of, format_table


def test_scale_fleet_repeats_the_trace_nodes_under_new_names() -> None:
    nodes = [
        TraceNode(name=f"t{i}", cpu_milli=1000 * (i + 1), memory_mib=1024, gpus=i) for i in range(3)
    ]
    fleet = fleet_of(nodes, 7)
    assert [n.name for n in fleet][:2] == ["scale-node-00000", "scale-node-00001"]
    assert [n.gpus for n in fleet] == [0, 1, 2, 0, 1, 2, 0]
    assert len({n.name for n in fleet}) == 7


def test_scale_table_sets_each_profile_against_binpack_of_its_fleet_and_node_count() -> None:
    pods = [
        TracePod(name=f"p{i}", cpu_milli=1, memory_mib=1, gpus=1, creation_time=0)
        for i in range(100)
    ]
    nodes = [TraceNode(name="n", cpu_milli=10**6, memory_mib=10**6, gpus=200)]
    base = replace(
        compute_metrics("binpack", nodes, pods, ["n"] * 100, 1.0),
        fleet="realistic",
        scheduling_s=2.0,
    )
    runs = [
        replace(base, attempt_p99_s=0.004, attempt_mean_s=0.001, algorithm_p99_s=0.002),
        replace(base, profile="fragmentation", scheduling_s=2.5, attempt_p99_s=0.008),
        replace(base, fleet="bare", scheduling_s=1.0),
        replace(base, fleet="bare", profile="fragmentation", scheduling_s=0.5),
        replace(base, fleet="bare", nodes=2, profile="default"),
    ]
    lines = format_table(runs).splitlines()
    assert lines[2:] == [
        "| realistic | 1 | binpack | 100 | 50.0 | 1.00x | 4.00 | 1.00 | 2.00 |",
        "| realistic | 1 | fragmentation | 100 | 40.0 | 0.80x | 8.00 |  |  |",
        "| bare | 1 | binpack | 100 | 100.0 | 1.00x |  |  |  |",
        "| bare | 1 | fragmentation | 100 | 200.0 | 2.00x |  |  |  |",
        "| bare | 2 | default | 100 | 50.0 |  |  |  |  |",
    ]


def test_scale_fleets_are_checked_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.scheduler_scale import main

    with pytest.raises(SystemExit) as exit_info:
        main(["trace", "--fleets", "bare,cloud"])
    assert exit_info.value.code == 2
    assert "--fleets 'bare,cloud': expected some of bare, realistic" in capsys.readouterr().err
