"""Faults during `pulumi up` under the real engine: the API server or etcd restarted while the
local stack is being applied. Whatever the run said, the next `pulumi up` leaves the stack
exactly as an uninterrupted one: every object there, the pool tainted, nothing pending, the
nodes' ownership records (what the stack added and what was there before) kept, so `destroy`
still puts every node back as it was.

Each prints one line (fault, what the run said, what the next `up` did) for the fault table
in bench/README.md (`pytest -s`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from components.providers.node_api import OWNERSHIP_PREFIX
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack, StackError

from .conftest import require_e2e_tools

STACK = "local"


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


def test_the_stack_scheduler_killed_during_up_harms_nothing_of_the_stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The binpack scheduler's process killed while an `up` applies a config change: the run
    does not depend on it and succeeds; GPU pods wait (Pending) until the kubelet has restarted
    it, then bind; the next `up` changes nothing."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-fault-scheduler")) as applied:
        applied.up()
        assert applied.runtime is not None
        scheduler = applied.outputs["schedulerName"]
        (process,) = [p for p in applied.runtime.processes.values() if scheduler in p.name]
        pool = dict(stack_config(STACK)["gpuPool"])
        labels = {**pool["labels"], "gpu-cluster.io/environment": "during-fault"}
        applied.set_config({"gpuPool": {**pool, "labels": labels}})
        said = _up_with_fault(applied, lambda: os.kill(process.process.pid or 0, 9), after=1)
        assert said.startswith("succeeded"), said
        assert not process.process.running()
        core: Any = client.CoreV1Api(applied.api_client())
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="jobs")))
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train"},
            "spec": {
                "schedulerName": scheduler,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/cuda-job:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        }
        core.create_namespaced_pod("jobs", pod)
        time.sleep(3)
        assert core.read_namespaced_pod("train", "jobs").spec.node_name is None
        applied.sync_pods()  # the kubelet restarts the container
        deadline = time.monotonic() + 60
        while core.read_namespaced_pod("train", "jobs").spec.node_name is None:
            assert time.monotonic() < deadline, "not bound after the scheduler came back"
            time.sleep(0.5)
        print(f"\nFAULT scheduler process killed during up | {said} | next up: ", end="")
        again = applied.up()
        print(f"{len(again)} changes")
        assert again == []
        core.delete_namespace("jobs")
        applied.destroy()
        assert applied.node_state() == applied.nodes_before


def test_a_program_error_after_the_claim_is_declared_ends_the_run_and_applies_nothing(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer that raises while the stack is being declared (after the claim, before the
    check that lets it apply): `pulumi up` ends naming the error, with nothing on the cluster,
    rather than waiting for a check that never comes."""
    require_e2e_tools()
    import components

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the gate layer broke")

    monkeypatch.setattr(components, "OpaGate", broken)
    workdir = tmp_path_factory.mktemp("e2e-program-error")
    with AppliedStack(STACK, workdir) as applied:
        core: Any = client.CoreV1Api(applied.api_client())
        namespaces = {n.metadata.name for n in core.list_namespace().items}
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                applied.up()
            except StackError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=300)
        assert not thread.is_alive(), "up hung after the program error"
        assert outcome and "the gate layer broke" in str(outcome[0])
        assert applied.node_state() == applied.nodes_before
        assert {n.metadata.name for n in core.list_namespace().items} == namespaces
