"""The openb replay's modules: trace parsing, the GPU mapping and the metrics, on hand-made rows.

The replay itself needs the built control plane and takes minutes; it is run by hand
(bench/README.md), not here.
"""

from __future__ import annotations

import csv
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.fleet import allocatable, daemonset_requests
from bench.openb_trace import (
    TraceError,
    TraceNode,
    TracePod,
    arrival_order,
    fitting,
    gpu_request,
    read_nodes,
    read_pods,
)
from bench.replay_cluster import (
    BINARIES,
    TRACE_IMAGE,
    Decisions,
    Outcome,
    ReplayCluster,
    WatchExpired,
    first_attempts,
    follow,
    measure,
    out_of_order_attempts,
    pod_object,
    render,
    scheduler_config,
)
from bench.replay_results import (
    CURVE_STEP,
    GPU,
    attempt_mean,
    attempt_quantile,
    compute_metrics,
    csv_row,
    format_table,
    no_node_has_gpus,
    summary_table,
    write_csv,
    write_curves,
)
from stack_config import SchedulerConfig

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def _make_pods(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text("\n".join((POD_HEADER, *rows)) + "\n")
    return path


def _pod(gpus: int, name: str = "p") -> TracePod:
    return TracePod(name=name, cpu_milli=1000, memory_mib=1024, gpus=gpus, creation_time=0)


def _nodes(*gpus: int) -> list[TraceNode]:
    return [
        TraceNode(name=f"n{i}", cpu_milli=8000, memory_mib=16384, gpus=g)
        for i, g in enumerate(gpus)
    ]


def test_openb_gpu_request_rounds_a_shared_gpu_up_to_one() -> None:
    assert gpu_request(1, 460) == 1
    assert gpu_request(1, 1000) == 1
    assert gpu_request(8, 1000) == 8
    assert gpu_request(0, 0) == 0
    assert gpu_request(0, 250) == 1


def test_openb_read_pods_orders_by_creation_time_keeping_file_order_on_ties(
    tmp_path: Path,
) -> None:
    path = _make_pods(
        tmp_path,
        "late,4000,8192,2,1000,,LS,Running,50,90,50",
        "shared,6000,12288,1,460,,LS,Running,10,,10",
        "cpu,88000,65536,0,0,,BE,Failed,10,20,10",
    )
    pods = read_pods(path)
    assert [p.name for p in pods] == ["shared", "cpu", "late"]
    assert pods[0] == TracePod(
        name="shared",
        cpu_milli=6000,
        memory_mib=12288,
        gpus=1,
        creation_time=10,
        deletion_time=None,
        gpu_milli=460,
    )
    assert (pods[1].gpus, pods[2].gpus, pods[2].deletion_time) == (0, 2, 90)


def test_openb_read_pods_names_file_line_column_and_value(tmp_path: Path) -> None:
    path = _make_pods(tmp_path, "ok,1000,1024,1,1000,,LS,Running,0,,0", "bad,1000,1024,x,0,,,,1,,1")
    with pytest.raises(TraceError, match=r"pods\.csv:3: column 'num_gpu' is 'x'; expected an int"):
        read_pods(path)


def test_openb_read_pods_rejects_gpu_milli_above_one_gpu(tmp_path: Path) -> None:
    path = _make_pods(tmp_path, "big,1000,1024,1,1500,,LS,Running,0,,0")
    with pytest.raises(TraceError, match=r"'gpu_milli' is 1500; expected 0..1000"):
        read_pods(path)


def test_openb_read_nodes_reports_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,model\nn0,64000,262144,P100\n")
    with pytest.raises(TraceError, match=r"missing column\(s\) gpu"):
        read_nodes(path)
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
    assert read_nodes(path) == [TraceNode(name="n0", cpu_milli=64000, memory_mib=262144, gpus=2)]


def test_openb_metrics_first_fragmentation_rejection_is_when_free_gpus_would_fit() -> None:
    # Two 4-GPU nodes spread 3+3: the 2-GPU pod is rejected with 2 GPUs free in total.
    pods = [*(_pod(1) for _ in range(6)), _pod(8), _pod(2), _pod(0), _pod(1)]
    placed: list[str | None] = ["a", "b", "a", "b", "a", "b", None, None, None, "a"]
    m = compute_metrics("default", _nodes(4, 4), pods, placed, wall_s=1.5)
    # The 8-GPU pod (#6) could not fit in 2 free GPUs anyway: not fragmentation.
    assert (m.first_frag_index, m.first_frag_gpus, m.alloc_at_first_frag) == (7, 2, 0.75)
    assert m.final_alloc == 7 / 8
    assert m.rejected_by_gpus == {0: 1, 2: 1, 8: 1}
    assert (m.bound, m.pods, m.total_gpus) == (7, 10, 8)


def test_openb_metrics_without_fragmentation_have_no_first_rejection() -> None:
    m = compute_metrics("binpack", _nodes(2), [_pod(2), _pod(1)], ["a", None], wall_s=0.1)
    assert m.first_frag_index is None and m.alloc_at_first_frag is None
    assert m.final_alloc == 1.0
    assert m.rejected_by_gpus == {1: 1}


NO_NODE = (
    f"0/2 nodes are available: 2 Insufficient {GPU}, 1 Insufficient cpu. no new claims to "
    "deallocate, preemption: 0/2 nodes are available: 2 No preemption victims found."
)
ONE_NODE = f"0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient {GPU}. preemption: x"


def test_openb_no_node_has_gpus_reads_the_unschedulable_message() -> None:
    assert no_node_has_gpus(NO_NODE)
    assert no_node_has_gpus(f"0/12 nodes are available: 12 Insufficient {GPU}.")
    assert not no_node_has_gpus(ONE_NODE)
    assert not no_node_has_gpus(f"0/12 nodes are available: 2 Insufficient {GPU}.")
    assert not no_node_has_gpus("")


def test_openb_metrics_split_gpu_fragmentation_from_stranded_gpus() -> None:
    pods = [_pod(1), _pod(1), _pod(1), _pod(1), _pod(8)]
    placed: list[str | None] = ["a", None, "b", None, None]
    messages = ["", ONE_NODE, "", NO_NODE, NO_NODE]
    m = compute_metrics("p", _nodes(2, 2), pods, placed, 1.0, messages=messages)
    assert m.alloc_at_first_frag == 0.25
    assert m.alloc_at_first_gpu_frag == 0.5
    # The 8-GPU pod never fit in 2 free GPUs: neither kind.
    assert (m.rejected_gpu_frag, m.rejected_stranded) == (1, 1)


def test_openb_first_attempts_counts_out_of_order_scheduling() -> None:
    log = "\n".join(
        f'I1122 x schedule_one.go:1] "Attempting to schedule pod" pod="openb/p{i:05d}-openb-pod-{i}"'
        for i in (0, 1, 3, 2, 3, 4)
    )
    attempts = first_attempts(log)
    assert attempts == [0, 1, 3, 2, 4]
    assert out_of_order_attempts(attempts) == 1
    assert out_of_order_attempts([0, 1, 2]) == 0


def test_openb_pod_object_requests_whole_gpus_and_tolerates_the_pool() -> None:
    pod: dict[str, Any] = pod_object(7, _pod(2, "openb-pod-0007"), "gpu-binpack-scheduler")
    (container,) = pod["spec"]["containers"]
    assert pod["metadata"]["name"] == "p00007-openb-pod-0007"
    assert pod["spec"]["schedulerName"] == "gpu-binpack-scheduler"
    assert container["resources"] == {
        "requests": {"cpu": "1000m", "memory": "1024Mi", GPU: "2"},
        "limits": {GPU: "2"},
    }
    assert pod["spec"]["tolerations"] == [
        {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]
    cpu_only = pod_object(0, _pod(0), "default-scheduler")["spec"]["containers"][0]
    assert GPU not in cpu_only["resources"]["requests"]


def test_openb_scheduler_config_scores_every_node_in_default_and_binpack() -> None:
    default_name, default = scheduler_config("default", "/kc")
    binpack_name, binpack = scheduler_config("binpack", "/kc")
    assert (default_name, binpack_name) == ("default-scheduler", "gpu-binpack-scheduler")
    for config in (default, binpack):
        (profile,) = config["profiles"]
        assert profile["percentageOfNodesToScore"] == 100
        assert config["leaderElection"]["leaderElect"] is False
    assert default["clientConnection"] == binpack["clientConnection"]
    assert "pluginConfig" not in default["profiles"][0]
    strategy = binpack["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy["type"] == "RequestedToCapacityRatio"
    expected = (
        "profile 'spread': expected one of default, mostallocated, binpack, fragmentation, "
        "binpack-gangs, fragmentation-gangs"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        scheduler_config("spread", "/kc")


def test_openb_results_go_to_csv_and_table(tmp_path: Path) -> None:
    m = compute_metrics("default", _nodes(4), [_pod(4), _pod(1)], ["a", None], wall_s=12.34)
    out = tmp_path / "results" / "openb.csv"
    write_csv(out, [m])
    (row,) = list(csv.DictReader(out.open()))
    assert row == csv_row(m)
    assert (row["final_alloc"], row["rejected_1gpu"], row["wall_s"]) == ("1.0000", "1", "12.3")
    table = format_table([m])
    assert "| default | none | none | 100.0% | 1/0/0/0 | 0 | 0 / 0 | 1 / 2 | 12 |" in table


class _FakeApi:
    """Stands in for the API server: scripted lists and watch streams (dropped or expired)."""

    def __init__(self, lists: list[list[str]], streams: list[list[str] | Exception]) -> None:
        self.lists = lists
        self.streams = streams
        self.watched_from: list[str] = []
        self.version = 100

    def _obj(self, name: str) -> dict[str, Any]:
        self.version += 1
        if not name:
            return {"metadata": {"resourceVersion": str(self.version)}}  # a bookmark
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}

    def request(self, method: str, path: str) -> dict[str, Any]:
        items = [self._obj(name) for name in self.lists.pop(0)]
        return {"metadata": {"resourceVersion": str(self.version)}, "items": items}

    def watch(self, path: str, version: str, on_object: Any) -> bool:
        self.watched_from.append(version)
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        return any(on_object(self._obj(name)) for name in stream)


def test_openb_follow_resumes_a_dropped_watch_and_relists_when_expired() -> None:
    api = _FakeApi(
        lists=[["a"], ["a", "b", "c"]],
        streams=[["b", ""], [], WatchExpired("104"), ["d"]],
    )
    seen: list[str] = []

    def on_object(obj: dict[str, Any]) -> bool:
        seen.append(obj["metadata"]["name"])
        return obj["metadata"]["name"] == "d"

    follow(api, "/pods", on_object)  # type: ignore[arg-type]
    # Resumes from the bookmark's version after the drop, lists again after the 410.
    assert api.watched_from == ["101", "103", "103", "106"]
    assert seen == ["a", "b", "a", "b", "c", "d"]


def test_openb_scheduler_config_renders_given_settings_with_their_sampling() -> None:
    settings = SchedulerConfig.model_validate({"balancedAllocation": {"weight": 0}})
    _, config = scheduler_config("binpack", "/kc", settings)
    (profile,) = config["profiles"]
    # Settings that leave percentageOfNodesToScore unset keep the adaptive default.
    assert "percentageOfNodesToScore" not in profile
    assert profile["plugins"]["score"] == {
        "disabled": [{"name": "NodeResourcesBalancedAllocation"}]
    }
    assert config["leaderElection"]["leaderElect"] is False


class _SlowDeleteApi:
    """The API server timing out on the first deletes of every pod, then done."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.deletes = 0

    def request(self, method: str, path: str) -> dict[str, Any]:
        if method == "DELETE":
            self.deletes += 1
            if self.deletes <= self.timeouts:
                raise RuntimeError(f"{method} {path}: HTTP 504: Timeout")
            return {}
        return {"items": []}


def test_openb_clearing_pods_asks_again_when_the_api_server_times_out() -> None:
    cluster: Any = object.__new__(ReplayCluster)  # no control plane: only the API is used
    slow = _SlowDeleteApi(timeouts=2)
    cluster.api, cluster.gangs, cluster.dra = slow, False, False
    cluster._clear_pods()
    assert slow.deletes == 3
    cluster.api = _SlowDeleteApi(timeouts=5)
    with pytest.raises(RuntimeError, match="HTTP 504"):
        cluster._clear_pods()


def test_openb_fragmentation_profile_is_the_stacks_with_the_plugin_binary() -> None:
    """The third profile is what `scheduler.scoring: fragmentation` deploys, every node scored,
    run by the built gpu-binpack-scheduler (upstream kube-scheduler lacks the plugin)."""
    name, config = scheduler_config("fragmentation", "/kc")
    (profile,) = config["profiles"]
    assert name == "gpu-binpack-scheduler" == profile["schedulerName"]
    assert profile["percentageOfNodesToScore"] == 100
    assert profile["plugins"]["score"]["enabled"] == [{"name": "GpuFragmentation", "weight": 10}]
    assert profile["pluginConfig"] == [
        {
            "name": "GpuFragmentation",
            "args": {"gpuResources": ["nvidia.com/gpu"], "migResourcePrefix": ""},
        }
    ]
    assert BINARIES == {
        "fragmentation": "gpu-binpack-scheduler",
        "fragmentation-gangs": "gpu-binpack-scheduler",
    }


def test_openb_metrics_first_fragmentation_ignores_a_pod_no_empty_node_fits() -> None:
    # The 2-GPU pod asks for more cpu than any node has: rejected, but not fragmentation.
    greedy = TracePod(name="g", cpu_milli=9000, memory_mib=1024, gpus=2, creation_time=0)
    pods = [_pod(1), greedy, _pod(1), _pod(1), _pod(1), _pod(2)]
    placed: list[str | None] = ["n0", None, "n1", "n0", "n1", None]
    m = compute_metrics("default", _nodes(2, 2), pods, placed, wall_s=1.0)
    assert m.fits_no_node == 1
    assert m.first_frag_index is None
    m = compute_metrics("default", _nodes(4, 2), pods, ["n0", None, "n1", "n0", "n1", None], 1.0)
    assert (m.first_frag_index, m.first_frag_gpus, m.alloc_at_first_frag) == (5, 2, 4 / 6)


def test_openb_metrics_count_a_shared_gpu_as_its_fraction_beside_whole_gpus() -> None:
    shared = TracePod(
        name="s", cpu_milli=100, memory_mib=64, gpus=1, creation_time=0, gpu_milli=250
    )
    pods = [shared, _pod(1), _pod(2), _pod(1)]
    m = compute_metrics("p", _nodes(4), pods, ["n0", "n0", None, "n0"], wall_s=1.0)
    assert (m.final_alloc, m.final_alloc_shared) == (3 / 4, 2.25 / 4)
    assert (m.alloc_at_first_frag, m.alloc_shared_at_first_frag) == (2 / 4, 1.25 / 4)
    assert m.curve[0] == (1 / 4, 1 / 4, 0.25 / 4, 0.25 / 4)
    assert m.curve[-1] == (5 / 4, 3 / 4, 4.25 / 4, 2.25 / 4)


@pytest.mark.parametrize(
    ("pod", "fits_any"),
    [
        (TracePod(name="a", cpu_milli=8000, memory_mib=16384, gpus=4, creation_time=0), True),
        (TracePod(name="b", cpu_milli=8001, memory_mib=1, gpus=1, creation_time=0), False),
        (TracePod(name="c", cpu_milli=1, memory_mib=16385, gpus=0, creation_time=0), False),
        (TracePod(name="d", cpu_milli=1, memory_mib=1, gpus=5, creation_time=0), False),
    ],
)
def test_openb_fitting_asks_whether_some_empty_node_holds_the_pod(
    pod: TracePod, fits_any: bool
) -> None:
    assert fitting([pod], _nodes(2, 4)) == [fits_any]


def test_openb_arrival_orders_are_the_trace_or_a_seeded_shuffle() -> None:
    pods = [_pod(1, name=f"p{i}") for i in range(20)]
    assert arrival_order(pods, 0) == pods
    once, again = arrival_order(pods, 3), arrival_order(pods, 3)
    assert (
        once == again
        and once != pods
        and sorted(p.name for p in once) == sorted(p.name for p in pods)
    )
    assert arrival_order(pods, 4) != once


def test_openb_summary_gives_the_mean_and_spread_over_orders() -> None:
    runs = [
        replace(compute_metrics("binpack", _nodes(2), [_pod(1), _pod(2)], placed, 1.0), order=n)
        for n, placed in ((1, ["n0", None]), (2, [None, "n0"]))
    ]
    table = summary_table(runs)
    row = table.splitlines()[2]
    # Order 1 never fragments (1 GPU free for a 2-GPU pod), so its final 50% stands in;
    # order 2 turns the 1-GPU pod away on an empty cluster: fragmentation at 0%.
    assert row.startswith("| bare | binpack | 2 | 25.0% (0.0%-50.0%) | 75.0% (50.0%-100.0%) |")
    assert row.endswith("| 1 |")


def test_openb_most_allocated_profile_is_the_documented_bin_packing_example() -> None:
    name, config = scheduler_config("mostallocated", "/kc")
    (profile,) = config["profiles"]
    assert name == "default-scheduler" and profile["percentageOfNodesToScore"] == 100
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    assert fit["args"]["scoringStrategy"] == {
        "type": "MostAllocated",
        "resources": [
            {"name": "cpu", "weight": 1},
            {"name": "memory", "weight": 1},
            {"name": GPU, "weight": 3},
        ],
    }


def test_openb_curves_keep_every_step_th_pod_and_the_last(tmp_path: Path) -> None:
    pods = [_pod(1, name=f"p{i}") for i in range(CURVE_STEP + 2)]
    m = compute_metrics("p", _nodes(64), pods, ["n0"] * len(pods), 1.0)
    path = tmp_path / "c.csv"
    write_curves(path, [m])
    rows = list(csv.DictReader(path.open()))
    assert [int(r["pod"]) for r in rows] == [0, CURVE_STEP, CURVE_STEP + 1]
    assert float(rows[-1]["allocated"]) == pytest.approx(len(pods) / 64, abs=1e-5)


def test_openb_realistic_cluster_sees_nodes_net_of_reservations_and_daemonsets() -> None:
    node = TraceNode(name="n0", cpu_milli=96000, memory_mib=393216, gpus=8)
    bare = ReplayCluster([node], log=lambda _: None)
    real = ReplayCluster([node], fleet="realistic", seed=7, log=lambda _: None)
    assert bare.view == [node]
    (seen,) = real.view
    system_cpu, system_memory = daemonset_requests()
    cpu, memory = allocatable("n0", 96000, 393216, 7)
    assert (seen.cpu_milli, seen.memory_mib, seen.gpus) == (
        cpu - system_cpu,
        memory - system_memory,
        8,
    )
    with pytest.raises(ValueError, match="fleet 'cloud': expected one of bare, realistic"):
        ReplayCluster([node], fleet="cloud")


def test_openb_curves_are_drawn_one_png_per_fleet(tmp_path: Path) -> None:
    from bench.plot_curves import draw

    pods = [_pod(1, name=f"p{i}") for i in range(60)]
    runs = [
        replace(compute_metrics(profile, _nodes(64), pods, placed, 1.0), fleet=kind, order=order)
        for kind in ("bare", "realistic")
        for profile, placed in (("default", ["n0"] * 50 + [None] * 10), ("binpack", ["n0"] * 60))
        for order in (1, 2)
    ]
    curves = tmp_path / "r.curve.csv"
    write_curves(curves, runs)
    written = draw(curves, tmp_path / "figures")
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "figures/r_bare.png",
        "figures/r_realistic.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_openb_curves_of_a_file_named_for_its_fleet_name_the_fleet_once(tmp_path: Path) -> None:
    from bench.plot_curves import draw

    pods = [_pod(1, name=f"p{i}") for i in range(30)]
    runs = [replace(compute_metrics("binpack", _nodes(64), pods, ["n0"] * 30, 1.0), fleet="bare")]
    curves = tmp_path / "openb-cpu1.5_bare.curve.csv"
    write_curves(curves, runs)
    assert [p.name for p in draw(curves, tmp_path)] == ["openb-cpu1.5_bare.png"]


EXPOSITION = """\
# HELP scheduler_scheduling_attempt_duration_seconds [STABLE] Scheduling attempt latency
# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.001"} 50
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.002"} 90
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.004"} 90
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="+Inf"} 90
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 0.09
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 90
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="0.001"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="0.002"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="0.004"} 10
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="+Inf"} 10
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="unschedulable"} 0.03
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="unschedulable"} 10
"""


@pytest.mark.parametrize(
    ("q", "expected"), [(0.5, 0.001), (0.7, 0.0015), (0.95, 0.003), (0.99, 0.0038)]
)
def test_openb_attempt_quantile_interpolates_in_the_buckets_of_every_result(
    q: float, expected: float
) -> None:
    assert attempt_quantile(EXPOSITION, q) == pytest.approx(expected)


def test_openb_attempt_latency_without_observations_is_unknown() -> None:
    assert attempt_quantile("", 0.99) is None and attempt_mean("") is None
    assert attempt_mean(EXPOSITION) == pytest.approx(0.12 / 100)


def _pod_seen(name: str, node: str | None = None, message: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": name}, "spec": {}, "status": {}}
    if node:
        pod["spec"]["nodeName"] = node
    if message is not None:
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
    return pod


def test_openb_render_names_the_pods_in_arrival_order_for_the_profiles_scheduler() -> None:
    pods = [_pod(1, name="b"), _pod(0, name="a")]
    rendered = render("binpack", pods, "/kubeconfig", image=lambda pod: f"img/{pod.name}")
    name, config = scheduler_config("binpack", "/kubeconfig")
    assert rendered.profile == "binpack" and rendered.config == config
    assert [p["metadata"]["name"] for p in rendered.pods] == ["p00000-b", "p00001-a"]
    assert rendered.pods[1] == pod_object(1, pods[1], name, "img/a")
    assert {p["spec"]["schedulerName"] for p in rendered.pods} == {name}
    default = render("default", pods, "/kubeconfig", score_all=False)
    assert "percentageOfNodesToScore" not in default.config["profiles"][0]
    assert {c["image"] for p in default.pods for c in p["spec"]["containers"]} == {TRACE_IMAGE}


def test_openb_decisions_count_each_pod_once_and_end_when_all_are_decided() -> None:
    ticks = iter([1.0, 2.5])
    decisions = Decisions(["p00000-a", "p00001-b"], clock=lambda: next(ticks))
    assert not decisions.see(_pod_seen("other", node="n9"))  # not a pod of the run
    assert not decisions.see(_pod_seen("p00001-b"))  # pending
    assert not decisions.see(_pod_seen("p00001-b", message="0/2 nodes are available"))
    # A pod marked Unschedulable and bound later counts once, bound, its message kept.
    assert not decisions.see(_pod_seen("p00001-b", node="n1"))
    assert decisions.remaining == 1 and decisions.scheduling_s() is None
    assert decisions.see(_pod_seen("p00000-a", node="n0"))
    assert decisions.placed == ["n0", "n1"]
    assert decisions.messages == ["", "0/2 nodes are available"]
    assert decisions.scheduling_s() == 1.5


def test_openb_measure_adds_the_runs_settings_and_latencies_to_the_metrics() -> None:
    pods = [_pod(1, name="a"), _pod(2, name="b")]
    rendered = render("default", pods, "/kubeconfig")
    outcome = Outcome(
        placed=("n0", None),
        messages=("", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."),
        wall_s=3.0,
        scheduling_s=1.25,
        attempts=(1, 0),
        exposition=EXPOSITION,
    )
    m = measure(rendered, pods, _nodes(2, 2), "realistic", outcome)
    assert m == replace(
        compute_metrics("default", _nodes(2, 2), pods, outcome.placed, 3.0, 1, outcome.messages),
        percentage_of_nodes_to_score=100,
        fleet="realistic",
        scheduling_s=1.25,
        attempt_p99_s=attempt_quantile(EXPOSITION, 0.99),
        attempt_mean_s=attempt_mean(EXPOSITION),
        algorithm_p99_s=None,
    )
    assert (m.out_of_order, m.rejected_gpu_frag, m.alloc_at_first_frag) == (1, 1, 0.25)
    # Attempts missing from the scheduler's log: the order was not checked.
    partial = replace(outcome, attempts=(0,))
    assert measure(rendered, pods, _nodes(2, 2), "bare", partial).out_of_order is None
