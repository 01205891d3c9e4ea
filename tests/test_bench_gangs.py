"""The gang benchmark's pure parts: jobs derived from a trace, their arrival, their PodGroups
and scheduler flags, the jobs' metrics and tables, on hand-made rows.

The replays themselves need the built control plane and take minutes; they are run by hand
(bench/results/gang-jobs/README.md), not here.
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from bench import gang_scale, openb_replay
from bench.derive_trace import SHAPE_COLUMNS, derive, group_jobs
from bench.openb_trace import (
    JOB_COLUMN,
    TraceError,
    TraceNode,
    TracePod,
    arrival_order,
    jobs_of,
    read_pods,
)
from bench.replay_cluster import (
    BINARIES,
    Decisions,
    JobTiming,
    Outcome,
    measure,
    podgroup_object,
    render,
    scheduler_flags,
)
from bench.replay_results import (
    GROUP_ATTEMPT_METRIC,
    JOB_FIELDS,
    Metrics,
    compute_job_metrics,
    compute_metrics,
    csv_row,
    job_summary_table,
    job_table,
    observations,
    write_csv,
)
from components.binpack_scheduler.settings import GANG_FEATURE_GATE

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time"


def _row(name: str, gpus: int, cpu: int = 8000, time: int = 0) -> dict[str, str]:
    return {
        "name": name,
        "cpu_milli": str(cpu),
        "memory_mib": "1024",
        "num_gpu": str(gpus),
        "gpu_milli": "1000" if gpus else "0",
        "creation_time": str(time),
    }


def _pod(gpus: int, name: str, job: str | None = None) -> TracePod:
    return TracePod(name=name, cpu_milli=1000, memory_mib=1024, gpus=gpus, creation_time=0, job=job)


def _nodes(*gpus: int) -> list[TraceNode]:
    return [
        TraceNode(name=f"n{i}", cpu_milli=8000, memory_mib=16384, gpus=g)
        for i, g in enumerate(gpus)
    ]


def _job_rows(count: int = 200) -> list[dict[str, str]]:
    """Multi-GPU pods of two shapes interleaved with 1-GPU and CPU-only pods, times rising."""
    rows = []
    for i in range(count):
        gpus = (0, 1, 2, 8)[i % 4]
        rows.append(_row(f"r{i:03d}", gpus, cpu=8000 + 1000 * gpus, time=10 * i))
    return rows


# ------------------------------------------------------------------ derived jobs


def test_gang_jobs_group_multi_gpu_pods_of_one_shape_into_2_to_16_workers() -> None:
    rows = _job_rows()
    out = group_jobs(rows, seed=5)
    assert sorted(r["name"] for r in out) == sorted(r["name"] for r in rows)
    by_job: dict[str, list[dict[str, str]]] = {}
    for r in out:
        if r[JOB_COLUMN]:
            by_job.setdefault(r[JOB_COLUMN], []).append(r)
    assert by_job and all(2 <= len(w) <= 16 for w in by_job.values())
    assert all(len({tuple(r[c] for c in SHAPE_COLUMNS) for r in w}) == 1 for w in by_job.values())
    # Every multi-GPU pod is in a job but for at most one lone worker per shape; others single.
    single = [r for r in out if not r[JOB_COLUMN]]
    assert sum(1 for r in single if int(r["num_gpu"]) > 1) <= 2
    assert {r["name"] for r in single if int(r["num_gpu"]) <= 1} == {
        r["name"] for r in rows if int(r["num_gpu"]) <= 1
    }
    assert group_jobs(rows, seed=5) == out
    assert group_jobs(rows, seed=6) != out


def test_gang_job_workers_take_their_first_workers_row_and_time() -> None:
    rows = [_row("a", 2, time=0), _row("b", 1, time=5), _row("c", 2, time=9)]
    out = group_jobs(rows, seed=1, workers=(2, 2))
    assert [(r["name"], r["creation_time"], r[JOB_COLUMN]) for r in out] == [
        ("a", "0", "job-00000"),
        ("c", "0", "job-00000"),
        ("b", "5", ""),
    ]


def test_gang_job_left_with_one_worker_is_a_single_pod_again() -> None:
    rows = [_row("a", 2), _row("b", 4), _row("c", 2)]
    out = group_jobs(rows, seed=1, workers=(2, 2))
    assert {r["name"]: r[JOB_COLUMN] for r in out} == {"a": "job-00000", "c": "job-00000", "b": ""}


def test_gang_jobs_refuse_worker_bounds_below_two_or_crossed() -> None:
    with pytest.raises(ValueError, match="job workers 1-4: expected 2 <= fewest <= most"):
        group_jobs([], seed=1, workers=(1, 4))
    with pytest.raises(ValueError, match="job workers 5-3"):
        group_jobs([], seed=1, workers=(5, 3))


def test_gang_derived_trace_has_a_job_column_the_replay_reads(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu\nn0,96000,786432,8\n"
    )
    rows = _job_rows(40)
    with (source / "openb_pod_list_default.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=HEADER.split(","))
        writer.writeheader()
        writer.writerows(rows)
    out = derive(source, tmp_path / "jobs", jobs=True, seed=2)
    pods = read_pods(out)
    jobs = jobs_of(pods)
    assert jobs and len(pods) == len(rows)
    # Each job's workers follow one another in arrival order.
    assert all(members == list(range(members[0], members[-1] + 1)) for members in jobs.values())
    with pytest.raises(TraceError, match="already has a 'job' column"):
        derive(tmp_path / "jobs", tmp_path / "again", jobs=True)


# ------------------------------------------------------------------ arrival, objects


def test_gang_arrival_order_moves_a_job_as_one() -> None:
    pods = [_pod(2, f"p{i}", job="j" if i in (3, 7, 11) else None) for i in range(20)]
    trace = arrival_order(pods, 0)
    assert [p.name for p in trace][:6] == ["p0", "p1", "p2", "p3", "p7", "p11"]
    shuffled = arrival_order(pods, 4)
    names = [p.name for p in shuffled]
    start = names.index("p3")
    assert names[start : start + 3] == ["p3", "p7", "p11"] and sorted(names) == sorted(
        p.name for p in pods
    )
    assert shuffled == arrival_order(pods, 4) and shuffled != trace


def test_gang_arrival_order_without_jobs_is_the_shuffle_of_single_pods() -> None:
    pods = [_pod(1, f"p{i}") for i in range(30)]
    assert arrival_order(pods, 7) == random.Random(7).sample(pods, len(pods))


def test_gang_profiles_run_the_stacks_settings_with_the_gate_and_their_pods_name_groups() -> None:
    pods = [_pod(2, "a", job="j0"), _pod(2, "b", job="j0"), _pod(1, "c")]
    gangs = render("fragmentation-gangs", pods, "/kubeconfig")
    assert f"{GANG_FEATURE_GATE}=true" in gangs.flags[0]
    assert "WatchListClient=false" in gangs.flags[0] and len(gangs.flags) == 1
    assert gangs.groups == (podgroup_object("j0", 2),)
    assert gangs.groups[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2
    assert [p["spec"].get("schedulingGroup") for p in gangs.pods] == [
        {"podGroupName": "j0"},
        {"podGroupName": "j0"},
        None,
    ]
    assert BINARIES["fragmentation-gangs"] == BINARIES["fragmentation"]
    for profile in ("default", "binpack", "fragmentation"):
        assert GANG_FEATURE_GATE not in " ".join(scheduler_flags(profile))
    assert f"{GANG_FEATURE_GATE}=true" in scheduler_flags("binpack-gangs")[0]


def test_gang_decisions_keep_the_order_pods_were_bound() -> None:
    decisions = Decisions(["p0", "p1", "p2"], clock=lambda: 0.0)
    decisions.see({"metadata": {"name": "p2"}, "spec": {"nodeName": "n0"}})
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    decisions.see(
        {"metadata": {"name": "p0"}, "spec": {}, "status": {"conditions": [unschedulable]}}
    )
    decisions.see({"metadata": {"name": "p2"}, "spec": {"nodeName": "n0"}})  # seen again
    decisions.see({"metadata": {"name": "p0"}, "spec": {"nodeName": "n1"}})  # bound at retry
    assert decisions.bound_order == [2, 0]


# ------------------------------------------------------------------ jobs' metrics


def test_gang_metrics_count_jobs_started_whole_and_gpus_incomplete_ones_hold() -> None:
    pods = [
        _pod(2, "a", job="j0"),
        _pod(2, "b", job="j0"),
        _pod(1, "c"),
        _pod(4, "d", job="j1"),
        _pod(4, "e", job="j1"),
    ]
    placed = ["n0", "n0", "n1", "n1", None]
    j = compute_job_metrics(_nodes(8, 8), pods, placed, bound_order=[0, 3, 1, 2])
    assert (j.jobs, j.whole, j.gpus, j.whole_gpus) == (2, 1, 12, 4)
    assert j.whole_gpu_share == pytest.approx(4 / 12)
    assert j.held_end == 4  # d, bound while e was rejected
    # After a, d: j0 holds 2, j1 holds 4; b completes j0.
    assert j.held_peak == 6
    # j1 needed 8 of the 16 GPUs with 5 allocated before it (11 free): the first rejection.
    assert j.alloc_at_first_rejection == pytest.approx(5 / 16)


def test_gang_metrics_count_no_rejection_for_a_job_larger_than_the_free_gpus() -> None:
    pods = [_pod(4, "a"), _pod(4, "b", job="j"), _pod(4, "c", job="j")]
    j = compute_job_metrics(_nodes(8), pods, ["n0", None, None], bound_order=[0])
    assert j.alloc_at_first_rejection is None and (j.held_end, j.held_peak) == (0, 0)
    # ...nor for a job a worker of which fits no empty node.
    too_big = [_pod(2, "a", job="j"), _pod(9, "b", job="j")]
    assert compute_job_metrics(_nodes(8, 8), too_big, [None, None]).alloc_at_first_rejection is None


def test_gang_metrics_without_bind_order_take_the_end_as_the_peak() -> None:
    pods = [_pod(2, "a", job="j"), _pod(2, "b", job="j")]
    j = compute_job_metrics(_nodes(8), pods, ["n0", None])
    assert (j.held_end, j.held_peak) == (2, 2)
    with pytest.raises(ValueError, match="1 outcomes for 2 pods"):
        compute_job_metrics(_nodes(8), pods, ["n0"])


GROUP_EXPOSITION = f"""\
{GROUP_ATTEMPT_METRIC}_bucket{{profile="p",result="scheduled",le="0.01"}} 2
{GROUP_ATTEMPT_METRIC}_bucket{{profile="p",result="scheduled",le="+Inf"}} 3
{GROUP_ATTEMPT_METRIC}_sum{{profile="p",result="scheduled"}} 0.5
{GROUP_ATTEMPT_METRIC}_count{{profile="p",result="scheduled"}} 3
"""


def test_gang_measure_adds_the_jobs_and_the_group_cycles_with_groups_only() -> None:
    pods = [_pod(2, "a", job="j"), _pod(2, "b", job="j")]
    outcome = Outcome(
        placed=("n0", "n0"),
        messages=("", ""),
        wall_s=1.0,
        scheduling_s=0.5,
        attempts=(0, 1),
        exposition=GROUP_EXPOSITION,
        bound_order=(1, 0),
    )
    m = measure(render("binpack-gangs", pods, "/k"), pods, _nodes(8), "bare", outcome)
    assert m.jobs == compute_job_metrics(_nodes(8), pods, outcome.placed, (1, 0))
    assert m.group_attempts == 3 and m.group_attempt_p99_s is not None
    assert m.pods_per_s == 4.0
    single = [_pod(2, "a"), _pod(2, "b")]
    plain = measure(render("binpack", single, "/k"), single, _nodes(8), "bare", outcome)
    assert plain.jobs is None and observations("", GROUP_ATTEMPT_METRIC) is None


def _run(profile: str, placed: list[str | None], order: int = 0) -> Metrics:
    pods = [_pod(2, "a", job="j"), _pod(2, "b", job="j"), _pod(4, "c")]
    m = compute_metrics(profile, _nodes(8), pods, placed, 1.0)
    return replace(
        m,
        order=order,
        scheduling_s=0.5,
        jobs=compute_job_metrics(_nodes(8), pods, placed, [0, 1, 2]),
    )


def test_gang_tables_and_csv_carry_the_jobs_columns(tmp_path: Path) -> None:
    gangs = _run("binpack-gangs", ["n0", "n0", "n0"])
    partial = _run("default", ["n0", None, "n0"], order=1)
    table = job_table([gangs, partial])
    # The peak counts a's GPUs held until b, the job's last worker, was bound.
    assert "| binpack-gangs | 1 / 1 | 100.0% | 0 / 2 | none | 100.0% | 6.0 |" in table
    assert "| default order 1 | 0 / 1 | 0.0% | 2 / 2 | 0.0% | 75.0% | 6.0 |" in table
    summary = job_summary_table([gangs, partial])
    assert "| bare | default | 1 | 0.0 of 1 (0-0) | 0.0% | 2 / 2 |" in summary
    path = tmp_path / "runs.csv"
    write_csv(path, [gangs, partial])
    rows = list(csv.DictReader(path.open()))
    assert set(JOB_FIELDS) <= set(rows[0])
    assert [r["gpus_held_incomplete_end"] for r in rows] == ["0", "2"]
    assert csv_row(replace(gangs, jobs=None)).keys().isdisjoint(JOB_FIELDS)


def test_gang_replay_refuses_gang_profiles_on_a_trace_without_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu\nn,1,1,1\n")
    (tmp_path / "openb_pod_list_default.csv").write_text(HEADER + "\np,1,1,1,1000,0\n")
    with pytest.raises(SystemExit):
        openb_replay.main([str(tmp_path), "--profiles", "binpack,binpack-gangs"])
    assert "--profiles binpack-gangs: the pod list openb_pod_list_default.csv names no job" in (
        capsys.readouterr().err
    )


# ------------------------------------------------------------------ at scale


def test_gang_scale_times_copies_of_the_largest_jobs_first_worker() -> None:
    pods = [_pod(2, "a", job="j0"), _pod(2, "b", job="j0"), _pod(8, "c", job="j1")]
    pods += [_pod(8, f"d{i}", job="j1") for i in range(2)]
    job = gang_scale.large_job(pods, 16)
    assert len(job) == 16 and {p.gpus for p in job} == {8}
    assert Counter(p.job for p in job) == {"job-large": 16}
    assert len({p.name for p in job}) == 16
    with pytest.raises(ValueError, match="names no job"):
        gang_scale.large_job([_pod(1, "x")], 16)


def test_gang_scale_table_sets_each_profile_against_binpack_without_gangs() -> None:
    pods = [_pod(1, f"p{i}", job="j" if i < 4 else None) for i in range(100)]
    nodes = [TraceNode(name="n", cpu_milli=10**6, memory_mib=10**6, gpus=200)]
    base = compute_metrics("binpack", nodes, pods, ["n"] * 100, 1.0)
    timing = JobTiming(
        profile="binpack",
        nodes=1,
        fleet="bare",
        workers=16,
        bound=16,
        wall_s=0.4,
        group_cycle_s=None,
    )
    results = [
        (replace(base, scheduling_s=1.0), timing),
        (
            replace(base, profile="binpack-gangs", scheduling_s=1.25, group_attempt_p99_s=0.02),
            replace(timing, profile="binpack-gangs", wall_s=0.5, group_cycle_s=0.1),
        ),
    ]
    table = gang_scale.format_table(results)
    assert "| bare | 1 | binpack | 100 (0) | 100.0 | 1.00x |  / - | 16/16, 0.40, - |" in table
    assert "| binpack-gangs | 100 (0) | 80.0 | 0.80x |  / 20.00 | 16/16, 0.50, 100.00 |" in table
