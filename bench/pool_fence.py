"""What the pool fence costs a pod create as the GPU pool grows.

The gate refuses a pod without a GPU bound to a pool node, so its native policies carry the
pool's node names (in CEL variables of their own: docs/scale.md). This benchmark times pod
creates (dry run, one client, one after another) on a local kube-apiserver for:

- `no-gate`: no admission policy at all: the floor;
- `gate`: the gate as OpaGate declares it for the routing engine, without the pool's nodes
  (the pool's taint, no fence by node name);
- `fence-N`: the same gate with N pool nodes of 46-character names.

Three pods each: a CPU pod bound to the last pool node (refused by the fences: the whole list
is searched), a CPU pod bound to another node (admitted: the list is searched too), and an
unbound CPU pod (the common case: the list is never read).

    python -m bench.pool_fence [--creates 300] [--nodes 1213,5000,20000]

Prints one row per variant and pod, with the median and 95th percentile in milliseconds and the
median against the floor's; writes them to bench/results/pool-fence/runs.csv.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import POOL_FENCE, markdown_table, write_rows
from components.opa_gate.manifests import gate_data, native_objects
from tools.harness import LocalControlPlane
from tools.harness.child_process import no_proxy_opener

SCHEDULER = "gpu-binpack-scheduler"
TEAM = "team-a"
API = "/apis/admissionregistration.k8s.io/v1"
TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}
OTHER_NODE = "cpu-node-1"
PODS = ("bound-to-the-last-pool-node", "bound-to-another-node", "unbound")
FIELDS = ("variant", "pool_nodes", "pod", "creates", "refused", "median_ms", "p95_ms", "vs_floor")
FLOOR = "no-gate"


def pool_nodes(count: int) -> list[str]:
    """`count` node names of 46 characters, as a rack-named fleet has them."""
    return [f"gpu-node-{i:05d}.rack-{i // 16:04d}.prod.example.internal" for i in range(count)]


def variants(sizes: Sequence[int]) -> list[tuple[str, int]]:
    """(variant, pool nodes) in the order they run: the floor, the gate, each fence."""
    return [(FLOOR, 0), ("gate", 0), *((f"fence-{n}", n) for n in sizes)]


def gate_objects(variant: str, nodes: Sequence[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """The variant's admission objects: none for the floor."""
    if variant == FLOOR:
        return []
    params = gate_data(SCHEDULER, [], [], pool_toleration=TOLERATION, pool_nodes=nodes)
    return native_objects(params, routing=True)


def pod(kind: str, last_pool_node: str) -> dict[str, Any]:
    """A CPU pod of `kind` (one of PODS)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/web:1",
                "resources": {"requests": {"cpu": "100m"}},
            }
        ]
    }
    if kind == "bound-to-the-last-pool-node":
        spec["nodeName"] = last_pool_node
    elif kind == "bound-to-another-node":
        spec["nodeName"] = OTHER_NODE
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "bench-"}, "spec": spec}


@dataclass(frozen=True)
class Row:
    variant: str
    pool_nodes: int
    pod: str
    creates: int
    refused: int
    median_ms: float
    p95_ms: float
    vs_floor: float
    """The median against the floor's for the same pod."""


def summarize(
    variant: str, nodes: int, kind: str, samples: Sequence[tuple[float, bool]], floor_ms: float
) -> Row:
    """A row of (seconds, refused) samples; `floor_ms` the floor's median for the same pod."""
    times = sorted(s * 1000 for s, _ in samples)
    median = statistics.median(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return Row(
        variant=variant,
        pool_nodes=nodes,
        pod=kind,
        creates=len(samples),
        refused=sum(1 for _, refused in samples if refused),
        median_ms=round(median, 2),
        p95_ms=round(p95, 2),
        vs_floor=round(median / floor_ms, 2) if floor_ms else 1.0,
    )


def _time_creates(
    cp: LocalControlPlane, body: dict[str, Any], creates: int
) -> list[tuple[float, bool]]:
    opener = no_proxy_opener(cp.ssl_context())
    data = json.dumps(body).encode()
    samples = []
    for _ in range(creates):
        request = urllib.request.Request(
            f"{cp.server}/api/v1/namespaces/{TEAM}/pods?dryRun=All", data=data, method="POST"
        )
        request.add_header("Content-Type", "application/json")
        start = time.perf_counter()
        try:
            with opener.open(request, timeout=10) as response:
                response.read()
            refused = False
        except urllib.error.HTTPError as exc:
            exc.read()
            refused = True
        samples.append((time.perf_counter() - start, refused))
    return samples


def _in_force(cp: LocalControlPlane, variant: str, nodes: Sequence[str]) -> None:
    """Wait until the API server enforces the variant's policies (a refused pod shows it)."""
    if variant == FLOOR:
        return
    probe = pod("bound-to-the-last-pool-node", nodes[-1]) if nodes else None
    if probe is None:  # the gate without nodes: a pod tolerating the pool's taint is refused
        probe = pod("unbound", "")
        probe["spec"]["tolerations"] = [{"operator": "Exists"}]
    deadline = time.monotonic() + 30
    while not _time_creates(cp, probe, 1)[0][1]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{variant}: the policies were not in force within 30 s")
        time.sleep(0.2)


def run(sizes: Sequence[int], creates: int) -> list[Row]:
    rows: list[Row] = []
    floor: dict[str, float] = {}
    with LocalControlPlane() as cp:
        cp.create_namespace(TEAM)
        for variant, count in variants(sizes):
            print(f"==> {variant}", flush=True)
            nodes = pool_nodes(count)
            made = gate_objects(variant, nodes)
            for collection, name, spec in made:
                cp.request(
                    "POST", f"{API}/{collection}", {"metadata": {"name": name}, "spec": spec}
                )
            _in_force(cp, variant, nodes)
            last = nodes[-1] if nodes else pool_nodes(1)[0]
            for kind in PODS:
                _time_creates(cp, pod(kind, last), 20)  # warm up
                samples = _time_creates(cp, pod(kind, last), creates)
                times = sorted(s for s, _ in samples)
                if variant == FLOOR:
                    floor[kind] = statistics.median(times) * 1000
                rows.append(summarize(variant, count, kind, samples, floor.get(kind, 0.0)))
            for collection, name, _ in reversed(made):
                cp.request("DELETE", f"{API}/{collection}/{name}")
            time.sleep(2)  # the deletions seen by the admission plugins
    return rows


def table(rows: Sequence[Row]) -> str:
    return markdown_table(FIELDS, (asdict(r) for r in rows))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=300, help="timed creates per pod")
    parser.add_argument("--nodes", default="1213,5000,20000", help="comma-separated pool sizes")
    parser.add_argument("--csv", type=Path, default=POOL_FENCE / "runs.csv")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",") if n]
    if not sizes or min(sizes) < 1:
        parser.error(
            f"--nodes: got {args.nodes!r}; expected comma-separated pool sizes of 1 or more"
        )
    rows = run(sizes, args.creates)
    write_rows(args.csv, FIELDS, (asdict(r) for r in rows))
    print(table(rows))


if __name__ == "__main__":
    main()
