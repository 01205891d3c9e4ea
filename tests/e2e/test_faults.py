"""Faults during `pulumi up` under the real engine: the API server or etcd restarted while the
local stack is being applied. Whatever the run said, the next `pulumi up` leaves the stack
exactly as an uninterrupted one: every object there, the pool tainted, nothing pending, the
nodes' ownership records (what the stack added and what was there before) kept, so `destroy`
still puts every node back as it was.

Each prints one line (fault, what the run said, what the next `up` did) for the fault table
in bench/README.md (`pytest -s`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from tools.harness.stack import AppliedStack, StackError

from .conftest import require_e2e_tools

STACK = "local"
OWNERSHIP_PREFIX = "ownership.gpu-cluster.io/"


def _up_with_fault(applied: AppliedStack, fault: Callable[[], None], after: int = 12) -> str:
    """`pulumi up`, with `fault` done once `after` resources have started; what it said."""
    outcome: list[str] = []

    def run() -> None:
        try:
            changes = applied.up()
            outcome.append(f"succeeded ({len(changes)} changes)")
        except StackError as exc:
            errors = [line.strip() for line in str(exc).splitlines() if "error" in line.lower()]
            outcome.append(f"failed: {errors[0] if errors else str(exc)[:200]}")

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while len(applied.engine.steps) < after and thread.is_alive():
        assert time.monotonic() < deadline, "up did not get going"
        time.sleep(0.05)
    fault()
    thread.join(timeout=600)
    assert not thread.is_alive(), "up hung after the fault"
    return outcome[0]


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_a_restart_during_up_is_repaired_by_the_next_up(
    component: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp(f"e2e-fault-{component}")) as applied:
        plane = applied.cluster.control_plane
        restart = plane.restart_apiserver if component == "kube-apiserver" else plane.restart_etcd
        said = _up_with_fault(applied, lambda: restart(3.0))
        applied.recover()
        repaired = applied.up()
        print(
            f"\nFAULT {component} restarted during up | {said} | next up: {len(repaired)} changes"
        )
        assert not applied.engine.deployment().get("pending_operations")
        assert applied.up() == []
        assert all(applied.exists(o) for o in applied.kubernetes_objects())
        taint = applied.outputs["gpuTaint"]
        nodes = applied.node_state()
        for name in applied.gpu_nodes:
            assert (taint["key"], taint["value"], taint["effect"]) in nodes[name]["taints"]
            owned = [k for k in nodes[name]["annotations"] if k.startswith(OWNERSHIP_PREFIX)]
            assert owned, f"{name} lost its ownership records"
        applied.destroy()
        assert applied.node_state() == applied.nodes_before
