"""The node layers at fleet scale: real `pulumi up`, no-op up, refresh, destroy vs the floor.

For each N (GPU nodes in the inventory), a fresh local control plane (etcd + kube-apiserver)
gets N GPU nodes registered as a kubelet registers them (status capacity; no heartbeats, so
the API server's load is the program's alone on this small machine). Then, with the real
Pulumi CLI (tools/build-pulumi.sh) and the stack's own node layers (TaintedGpuPool's taint
and ExtendedResourceNodes' advertised resource on every node: one node-set dynamic resource
per layer):

- `up`, a second `up` (no-op), `refresh`, `destroy`: wall time; the largest resident set of
  any one process on the engine's side during the step, and which (this process, which runs
  the program through the Automation API, the CLI, the provider host; sampled from /proc every
  0.1 s, the cluster's etcd and kube-apiserver left out); the state file's size;
- the floor: the same node changes done by a plain client loop (one JSON patch per taint and
  per extended resource, then their removal), in the same run;
- the program's evaluation under Pulumi mocks at the same N (no engine, no cluster).

    .venv/bin/python -m bench.scale                    # N = 100, 500, 1213, 2000
    .venv/bin/python -m bench.scale --nodes 100 500    # a subset
    .venv/bin/python -m bench.scale --parallel 64      # the engine's --parallel

Prints a table and writes `DEFAULT_CSV` (or --csv). It is a script, not a test: numbers
depend on the machine; the ratio to the floor is what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import pulumi
from kubernetes import client

from bench import NODE_LAYERS_SCALE, write_rows
from components import (
    ClusterAccess,
    ExtendedResourceNodes,
    ExtendedResourceNodesArgs,
    TaintedGpuPool,
    TaintedGpuPoolArgs,
)
from components.tainted_gpu_pool.settings import Taint
from tools.harness import LocalControlPlane
from tools.harness.fake_nodes import create_nodes, gpu_node
from tools.harness.processes import descendants, process_table, rss_mib
from tools.harness.pulumi_engine import inline_stack, use_cluster

REPO_ROOT = Path(__file__).resolve().parents[1]

SIZES = (100, 500, 1213, 2000)  # 1,213: the openb trace's node list
TAINT = Taint()
EXTENDED = {"example.com/nic": 1}
DEFAULT_CSV = NODE_LAYERS_SCALE / "scale.csv"


def node_names(n: int) -> list[str]:
    return [f"gpu-{i:04d}" for i in range(n)]


def program(nodes: Sequence[str]) -> Callable[[], None]:
    """The node layers for `nodes`: one taint and one extended resource per node."""

    def run() -> None:
        # The providers take the cluster from the stack config (use_cluster), as in the stack.
        access = ClusterAccess(provider=cast(Any, None))
        extended = ExtendedResourceNodes(
            "extended-resources",
            ExtendedResourceNodesArgs(access=access, nodes=dict.fromkeys(nodes, EXTENDED)),
        )
        TaintedGpuPool(
            "gpu-pool",
            TaintedGpuPoolArgs(access=access, nodes=nodes, taint=TAINT, labels={}),
            pulumi.ResourceOptions(depends_on=[extended]),  # as in __main__.py
        )

    return run


@dataclass
class Row:
    nodes: int
    step: str
    seconds: float
    floor_seconds: float | None
    ratio: float | None
    peak_rss_mib: float | None
    """The largest resident set of any one process of the engine's side during the step."""
    state_kib: float | None
    load: float | None = None
    """The machine's 1-minute load average at the end of the step (2 cores here)."""
    peak_process: str | None = None
    """Which process that was (the bench's own, which runs the program, or a child's name)."""


# The cluster's own processes: not the engine's side, whose memory the goal is about.
CLUSTER_PROCESSES = frozenset({"etcd", "kube-apiserver"})


class PeakSampler:
    """Samples, every `interval` s, the resident set of this process and of each of its
    descendants (but the cluster's), keeping each process's largest; `peak()` names the
    largest of all. /proc's VmRSS, so it needs Linux."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        table = process_table()
        for pid in [me, *descendants(me, table)]:
            name = "bench (program)" if pid == me else table[pid].name
            if name in CLUSTER_PROCESSES:
                continue
            self.peaks[name] = max(self.peaks.get(name, 0.0), rss_mib(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self) -> tuple[str, float]:
        """(process, MiB) of the largest resident set seen."""
        if not self.peaks:
            return ("?", 0.0)
        name = max(self.peaks, key=lambda k: self.peaks[k])
        return name, self.peaks[name]


def _state_kib(state_dir: Path) -> float:
    files = list((state_dir / "backend").rglob("*.json"))
    stacks = [f for f in files if "/stacks/" in str(f) and ".bak" not in f.name]
    return sum(f.stat().st_size for f in stacks) / 1024


def floor(api_client: Any, nodes: Sequence[str]) -> tuple[float, float]:
    """Seconds for a plain client to add, then remove, the same taint and extended resource."""
    core = client.CoreV1Api(api_client)
    taint = TAINT.as_dict()
    (name, count), *_ = EXTENDED.items()
    path = "/status/capacity/" + name.replace("~", "~0").replace("/", "~1")
    started = time.monotonic()
    for node in nodes:
        core.patch_node(node, {"spec": {"taints": [taint]}})
        core.patch_node_status(node, [{"op": "add", "path": path, "value": str(count)}])
    added = time.monotonic() - started
    started = time.monotonic()
    for node in nodes:
        core.patch_node(node, {"spec": {"taints": None}})
        core.patch_node_status(node, [{"op": "remove", "path": path}])
    return added, time.monotonic() - started


def mocks_seconds(nodes: Sequence[str]) -> float:
    """Evaluation of the same program under Pulumi mocks, in a fresh interpreter."""
    code = (
        "import time, pulumi\n"
        "from bench.scale import program\n"
        "class M(pulumi.runtime.Mocks):\n"
        "    def new_resource(self, a): return a.name + '-id', dict(a.inputs)\n"
        "    def call(self, a): return {}, []\n"
        "pulumi.runtime.set_mocks(M(), preview=False)\n"
        f"nodes = [f'gpu-{{i:04d}}' for i in range({len(nodes)})]\n"
        "start = time.monotonic()\n"
        "@pulumi.runtime.test\n"
        "def run():\n"
        "    program(nodes)()\n"
        "    return pulumi.Output.from_input(1)\n"
        "run()\n"
        "print(time.monotonic() - start)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def measure(
    n: int, parallel: int | None, skip_checkpoints: bool, log: Callable[[str], None]
) -> list[Row]:
    rows: list[Row] = []
    nodes = node_names(n)
    with tempfile.TemporaryDirectory(prefix=f"scale-{n}-") as tmp, LocalControlPlane() as cp:
        api_client = cp.api_client()
        started = time.monotonic()
        create_nodes(api_client, [gpu_node(name) for name in nodes])
        log(f"N={n}: {n} nodes registered in {time.monotonic() - started:.1f} s")
        floor_up, floor_down = floor(api_client, nodes)
        log(f"N={n}: floor {floor_up:.1f} s to add, {floor_down:.1f} s to remove")

        # The engine rewrites the whole state file after every step unless told to write it
        # once at the end (PULUMI_SKIP_CHECKPOINTS): with thousands of resources that is the
        # difference between linear and quadratic.
        env = {"PULUMI_SKIP_CHECKPOINTS": "true"} if skip_checkpoints else {}
        stack = inline_stack("gpu-cluster-scale", "scale", program(nodes), Path(tmp), env)
        use_cluster(stack, cp.kubeconfig_yaml())
        options: dict[str, Any] = {"parallel": parallel} if parallel else {}
        lines: list[str] = []

        def timed(step: str, run: Callable[[], Any], floor_s: float | None) -> Any:
            started = time.monotonic()
            with PeakSampler() as sampler:
                result = run()
            seconds = time.monotonic() - started
            peak_process, peak_mib = sampler.peak()
            ratio = seconds / floor_s if floor_s else None
            rows.append(
                Row(
                    n,
                    step,
                    round(seconds, 2),
                    floor_s and round(floor_s, 2),
                    ratio and round(ratio, 2),
                    round(peak_mib, 1),
                    round(_state_kib(Path(tmp)), 1),
                    round(os.getloadavg()[0], 1),
                    peak_process,
                )
            )
            shown = f" ({ratio:.1f}x floor)" if ratio else ""
            log(f"N={n}: {step} {seconds:.1f} s{shown}, load {os.getloadavg()[0]:.1f}")
            return result

        timed("up", lambda: stack.up(on_output=lines.append, **options), floor_up)
        timed("no-op up", lambda: stack.up(on_output=lines.append, **options), None)
        timed("refresh", lambda: stack.refresh(on_output=lines.append, **options), None)
        timed("destroy", lambda: stack.destroy(on_output=lines.append, **options), floor_down)
        seconds = mocks_seconds(nodes)
        rows.append(Row(n, "mocks eval", round(seconds, 2), None, None, None, None))
        log(f"N={n}: mocks evaluation {seconds:.1f} s")
    return rows


def print_table(rows: Sequence[Row]) -> None:
    header = f"{'nodes':>6} {'step':<11} {'seconds':>8} {'floor s':>8} {'ratio':>6} "
    header += f"{'peak MiB':>9} {'state KiB':>10} {'load':>5}  peak process"
    print(header)
    for r in rows:

        def fmt(value: float | None, width: int) -> str:
            return f"{value:>{width}}" if value is not None else f"{'-':>{width}}"

        print(
            f"{r.nodes:>6} {r.step:<11} {r.seconds:>8} {fmt(r.floor_seconds, 8)} "
            f"{fmt(r.ratio, 6)} {fmt(r.peak_rss_mib, 9)} {fmt(r.state_kib, 10)} {fmt(r.load, 5)}"
            f"  {r.peak_process or '-'}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--parallel", type=int, default=None, help="the engine's --parallel")
    parser.add_argument(
        "--csv", type=Path, default=DEFAULT_CSV, help="CSV to write (default: %(default)s)"
    )
    parser.add_argument(
        "--skip-checkpoints",
        action="store_true",
        help="PULUMI_SKIP_CHECKPOINTS=true: write the state once at the end of each operation",
    )
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for n in args.nodes:
        rows += measure(
            n,
            args.parallel,
            args.skip_checkpoints,
            lambda line: print(line, file=sys.stderr, flush=True),
        )
        _write_csv(args.csv, rows)  # after each N, so a long run keeps what it measured
    print_table(rows)
    print(f"\nwrote {args.csv}", file=sys.stderr)
    settings = {"parallel": args.parallel, "skip_checkpoints": args.skip_checkpoints}
    print(json.dumps(settings), file=sys.stderr)
    return 0


def _write_csv(path: Path, rows: Sequence[Row]) -> None:
    write_rows(path, [f.name for f in fields(Row)], (asdict(r) for r in rows))


if __name__ == "__main__":
    sys.exit(main())
