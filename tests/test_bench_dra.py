"""bench/dra.py and the replay's --dra mode: slices, claim templates, claim pods, the split of
rejections by placement, on hand-made pods and nodes.

The DRA replay itself needs the built control plane and takes minutes; it is run by hand
(bench/results/dra-replay/README.md), not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.dra import (
    claim_pod,
    claim_templates,
    claims_made,
    dra_capacity,
    node_slice,
    template_name,
)
from bench.openb_trace import TraceNode, TracePod
from bench.replay_cluster import ReplayCluster, node_capacity, pod_object, render
from bench.replay_results import GPU, compute_metrics
from components.gpu_resources import GPU_DEVICE_CLASS
from tools.harness.dra import DRIVER


def _pod(gpus: int, name: str = "p", gpu_milli: int = 1000) -> TracePod:
    return TracePod(
        name=name, cpu_milli=1000, memory_mib=1024, gpus=gpus, creation_time=0, gpu_milli=gpu_milli
    )


def _nodes(*gpus: int) -> list[TraceNode]:
    return [
        TraceNode(name=f"n{i}", cpu_milli=8000, memory_mib=16384, gpus=g)
        for i, g in enumerate(gpus)
    ]


def test_dra_claim_templates_one_per_gpu_count_asking_that_many_gpu_devices() -> None:
    templates = claim_templates([2, 0, 1, 8, 1, 2])
    assert [t["metadata"]["name"] for t in templates] == ["gpu-1", "gpu-2", "gpu-8"]
    requests = [t["spec"]["spec"]["devices"]["requests"] for t in templates]
    assert [r[0]["exactly"]["count"] for r in requests] == [1, 2, 8]
    assert {r[0]["exactly"]["deviceClassName"] for r in requests} == {GPU_DEVICE_CLASS}
    assert claim_templates([0, 0]) == []


def test_dra_template_name_refuses_a_pod_without_gpus() -> None:
    with pytest.raises(ValueError, match=r"gpus 0: a claim template asks for at least one GPU"):
        template_name(0)


def test_dra_claim_pod_moves_the_gpus_from_resources_to_a_claim() -> None:
    pod: dict[str, Any] = claim_pod(pod_object(3, _pod(4), "gpu-binpack-scheduler"), 4)
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "1000m", "memory": "1024Mi"},
        "limits": {},
        "claims": [{"name": "devices"}],
    }
    assert pod["spec"]["resourceClaims"] == [
        {"name": "devices", "resourceClaimTemplateName": "gpu-4"}
    ]
    # Everything else of the device-plugin pod is kept.
    assert pod["metadata"]["name"] == "p00003-p"
    assert pod["spec"]["schedulerName"] == "gpu-binpack-scheduler"
    assert pod["spec"]["tolerations"] == pod_object(3, _pod(4), "x")["spec"]["tolerations"]


def test_dra_claim_pod_leaves_a_cpu_only_pod_as_it_is() -> None:
    cpu_only = pod_object(0, _pod(0), "default-scheduler")
    assert claim_pod(cpu_only, 0) == cpu_only


def test_dra_render_claims_a_shared_gpu_as_one_whole_gpu_like_the_device_plugin_replay() -> None:
    pods = [_pod(1, "shared", gpu_milli=250), _pod(0, "cpu"), _pod(2, "pair")]
    plain = render("fragmentation", pods, "/kc")
    dra = render("fragmentation", pods, "/kc", dra=True)
    assert plain.templates == ()
    assert [t["metadata"]["name"] for t in dra.templates] == ["gpu-1", "gpu-2"]
    claimed = [p["spec"].get("resourceClaims") for p in dra.pods]
    assert claimed == [
        [{"name": "devices", "resourceClaimTemplateName": "gpu-1"}],
        None,
        [{"name": "devices", "resourceClaimTemplateName": "gpu-2"}],
    ]
    # The device-plugin pod asks for the same whole GPU the claim does.
    assert plain.pods[0]["spec"]["containers"][0]["resources"]["requests"][GPU] == "1"
    assert dra.config == plain.config


def test_dra_node_slice_holds_the_nodes_gpus_and_its_capacity_none() -> None:
    (node,) = _nodes(8)
    obj = node_slice(node)
    assert obj["spec"]["driver"] == DRIVER
    assert obj["spec"]["nodeName"] == "n0"
    assert [d["name"] for d in obj["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert dra_capacity(node_capacity(node)) == {"cpu": "8000m", "memory": "16384Mi", "pods": "110"}


def test_dra_claims_made_counts_pods_whose_status_names_every_claim() -> None:
    def pod(claims: list[str], statuses: dict[str, str | None]) -> dict[str, Any]:
        return {
            "spec": {"resourceClaims": [{"name": c} for c in claims]},
            "status": {
                "resourceClaimStatuses": [
                    {"name": n, "resourceClaimName": v} for n, v in statuses.items()
                ]
            },
        }

    pods = [
        pod(["devices"], {"devices": "p0-devices-abcde"}),
        pod(["devices"], {}),  # the controller has not made it yet
        pod(["devices"], {"devices": None}),  # not needed: not counted as made
        {"spec": {}, "status": {}},  # CPU-only
    ]
    assert claims_made(pods) == 1


def test_dra_metrics_split_rejections_by_the_gpus_left_on_each_node() -> None:
    # Two 4-GPU nodes: 3+3 bound, then a 2-GPU pod rejected with 1 free on each node (no node
    # has its GPUs), then 1+0 more and a 1-GPU pod rejected while n1 has one free (stranded).
    pods = [*(_pod(1) for _ in range(6)), _pod(2), _pod(1), _pod(1)]
    placed: list[str | None] = ["n0", "n1", "n0", "n1", "n0", "n1", None, "n0", None]
    messages = [""] * 6 + ["0/2 nodes are available: 2 Insufficient cpu."] + [""] * 2
    m = compute_metrics("default", _nodes(4, 4), pods, placed, 1.0, None, messages)
    dra = compute_metrics(
        "default", _nodes(4, 4), pods, placed, 1.0, None, messages, split_by_placement=True
    )
    # From the message, every rejection looks stranded (no GPU reason named).
    assert (m.rejected_gpu_frag, m.rejected_stranded) == (0, 2)
    assert (dra.rejected_gpu_frag, dra.rejected_stranded) == (1, 1)
    assert dra.alloc_at_first_gpu_frag == 6 / 8
    # The headline figures do not depend on the split.
    assert (dra.alloc_at_first_frag, dra.final_alloc) == (m.alloc_at_first_frag, m.final_alloc)


class _ClaimsApi:
    """Claims the API server keeps until their finalizers are lifted (the scheduler's
    delete-protection); a claim the controller deleted meanwhile answers 404."""

    def __init__(self, protected: set[str], gone: set[str]) -> None:
        self.protected = set(protected)
        self.gone = set(gone)
        self.patched: list[str] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        name = path.rsplit("/", 1)[-1]
        if method == "PATCH":
            self.patched.append(name)
            if name in self.gone:
                raise RuntimeError(f"PATCH {path}: HTTP 404: not found")
            assert body == {"metadata": {"finalizers": None}}
            self.protected.discard(name)
            return {}
        if method == "GET":
            held = sorted(self.protected | self.gone)
            self.gone.clear()
            return {"items": [{"metadata": {"name": n}} for n in held]}
        return {}


def test_dra_clearing_claims_lifts_the_finalizers_until_none_is_left() -> None:
    cluster: Any = object.__new__(ReplayCluster)  # no control plane: only the API is used
    api = _ClaimsApi(protected={"a", "b"}, gone={"c"})
    cluster.api, cluster.threads = api, 2
    cluster._clear_claims()
    assert sorted(api.patched) == ["a", "b", "c"]
    assert api.protected == set()


def test_dra_replay_refuses_a_trace_with_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.openb_replay import main

    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu\nn0,8000,16384,2\n")
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,job\n"
        "w0,1000,1024,1,1000,0,j0\nw1,1000,1024,1,1000,0,j0\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--nodes-file", "nodes.csv", "--pods-file", "pods.csv", "--dra"])
    assert exit_info.value.code == 2
    assert "--dra: the replay of jobs and the gang profiles run only without --dra" in (
        capsys.readouterr().err
    )
