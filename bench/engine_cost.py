"""The Pulumi engine's own cost per Python dynamic resource, without any cluster.

N resources whose provider does nothing (one per node, as the node layers had) against one
resource carrying the same N entries (a node set), with the real CLI: `up`, no-op `up`,
`destroy`. The difference is what the engine and the dynamic provider host charge per
resource (RegisterResource, Check, Diff, Create/Delete round trips), before any node call.

    .venv/bin/python -m bench.engine_cost             # N = 500
    .venv/bin/python -m bench.engine_cost --nodes 1213
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

import components.providers  # noqa: F401  (the SDK serializer fix)
from tools.harness.pulumi_engine import inline_stack


class Idle(ResourceProvider):
    """Creates, diffs (no change) and deletes without doing anything."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="idle", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=False)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        return None


class IdleResource(Resource, module="bench", name="Idle"):
    def __init__(self, name: str, props: dict[str, Any]) -> None:
        super().__init__(Idle(), name, props)


def program(n: int, per_node: bool) -> Callable[[], None]:
    nodes = [f"gpu-{i:04d}" for i in range(n)]

    def run() -> None:
        if per_node:
            for node in nodes:
                IdleResource(f"idle-{node}", {"node": node, "key": "nvidia.com/gpu"})
        else:
            IdleResource("idle-set", {"nodes": nodes, "key": "nvidia.com/gpu"})

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args(argv)
    print(f"{'shape':<22} {'up s':>6} {'no-op s':>8} {'destroy s':>10} {'load':>5}")
    for per_node in (True, False):
        with tempfile.TemporaryDirectory(prefix="engine-cost-") as tmp:
            env = {"PULUMI_SKIP_CHECKPOINTS": "true"}
            stack = inline_stack(
                "engine-cost", "bench", program(args.nodes, per_node), Path(tmp), env
            )
            seconds = []
            for step in (stack.up, stack.up, stack.destroy):
                started = time.monotonic()
                step(on_output=lambda _line: None)
                seconds.append(time.monotonic() - started)
        shape = f"{args.nodes} resources" if per_node else f"1 resource, {args.nodes} entries"
        up, noop, down = seconds
        print(f"{shape:<22} {up:>6.1f} {noop:>8.1f} {down:>10.1f} {os.getloadavg()[0]:>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
