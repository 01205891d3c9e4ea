"""The config's rule on the GPU pool's toleration (pool_toleration_problem) against a real
kube-apiserver: which GPU pods end up tolerating the pool's taint.

Two API servers, one with ExtendedResourceToleration on (as controlPlane.admissionPlugins
enables it) and one without; on each, every engine in force in turn, a pod asking only for one
kind of GPU resource (a whole GPU, a MIG profile, a renamed time-sliced GPU, an extended
resource) created as its users must create it (on the gate's scheduler for the refusing
engines; routed by the routing engine). The tolerations the API server gives each pod are
matched against each pool taint key as the scheduler matches them, and the pods left without
one must be exactly those untolerated_pool_resources() names: the config refuses exactly the
cells where a GPU pod would stay Pending. The minor (only v1.37 is built here) only says
whether the routing engine exists; the effect is NoSchedule, the one that strands pods.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.opa_gate.manifests import gate_data
from components.opa_gate.settings import (
    ADMISSION_ENGINES,
    EXTENDED_RESOURCE_TOLERATION,
    ROUTING_ENGINE,
    untolerated_pool_resources,
)
from components.tainted_gpu_pool.settings import Taint
from tests.integration.conftest import require_tools
from tests.integration.gate_live import (
    Gate,
    admitted,
    engine_active,
    gpu_pod,
    opa_serving,
    stored_tolerations,
    tolerates,
)
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane

SCHEDULER = "gpu-binpack-scheduler"
MIG_PREFIX = "nvidia.com/mig-"
# One resource of each kind a pool advertises, and how the config names the kind.
RESOURCES = {
    "nvidia.com/gpu": "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb": f"{MIG_PREFIX}*",
    "nvidia.com/gpu.shared": "nvidia.com/gpu.shared",
    "example.com/dongle": "example.com/dongle",
}
# The pools the config can describe: (names, prefixes) of what they advertise.
POOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "whole": (("nvidia.com/gpu",), ()),
    "mig-mixed": (("nvidia.com/gpu",), (MIG_PREFIX,)),
    "renamed-time-sliced": (("nvidia.com/gpu", "nvidia.com/gpu.shared"), ()),
    "extended-on-the-pool": (("example.com/dongle", "nvidia.com/gpu"), ()),
}
TAINT_KEYS = ("nvidia.com/gpu", "gpu-cluster.io/pool")
# Every kind gated, as the gate data of such pools gates it.
GATED = ["example.com/dongle", "nvidia.com/gpu.shared"]
CONFIG = gate_data(SCHEDULER, GATED, [MIG_PREFIX])


def _taint(key: str) -> Taint:
    return Taint.model_validate({"key": key, "value": "present", "effect": "NoSchedule"})


@pytest.fixture(scope="module")
def planes(control_plane: LocalControlPlane) -> Iterator[dict[bool, LocalControlPlane]]:
    """{ExtendedResourceToleration on: an API server}: the session's (off), and one with it."""
    require_tools(*CONTROL_PLANE_TOOLS)
    flag = f"--enable-admission-plugins={EXTENDED_RESOURCE_TOLERATION}"
    with LocalControlPlane([flag]) as with_plugin:
        yield {False: control_plane, True: with_plugin}


def _tolerations_by_resource(
    cp: LocalControlPlane, engine: str, key: str, opa: Any, namespace: str
) -> dict[str, list[dict[str, Any]]]:
    """With `engine` in force (the pool's taint keyed `key`), the tolerations a pod asking
    only for each of RESOURCES is admitted with."""
    api_client = cp.api_client()
    gate = Gate(
        config=gate_data(SCHEDULER, GATED, [MIG_PREFIX], pool_toleration=_taint(key).toleration()),
        namespace=f"gate-own-{uuid.uuid4().hex[:6]}",
    )
    # The refusing engines admit a GPU pod only on the gate's scheduler; routing sets it.
    scheduler = None if engine == ROUTING_ENGINE else SCHEDULER
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        with engine_active(engine, cp, api_client, namespace, gate, opa):
            for i, resource in enumerate(RESOURCES):
                pod = admitted(
                    api_client,
                    namespace,
                    gpu_pod(f"kind-{i}", {resource: "1"}, scheduler=scheduler),
                )
                assert pod.spec.scheduler_name == SCHEDULER, resource
                found[resource] = stored_tolerations(api_client, pod)
    finally:
        api_client.close()
    return found


@contextlib.contextmanager
def _namespace(cp: LocalControlPlane) -> Iterator[str]:
    name = f"tolerations-{uuid.uuid4().hex[:8]}"
    cp.create_namespace(name)
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            cp.request("DELETE", f"/api/v1/namespaces/{name}")


def _disagreements(
    engine: str, plugin_on: bool, key: str, tolerations: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """For each pool, where the pods left without a toleration of the taint keyed `key` differ
    from those the rule names."""
    taint = _taint(key).as_dict()
    left_out = {RESOURCES[r] for r, t in tolerations.items() if not tolerates(t, taint)}
    wrong = []
    for pool, (names, prefixes) in POOLS.items():
        live = sorted(left_out & {*names, *(f"{p}*" for p in prefixes)})
        rule = sorted(
            untolerated_pool_resources(
                engine=engine,
                admission_plugins=[EXTENDED_RESOURCE_TOLERATION] if plugin_on else [],
                taint_key=key,
                taint_effect="NoSchedule",
                names=names,
                prefixes=prefixes,
            )
        )
        if live != rule:
            plugin = f"{EXTENDED_RESOURCE_TOLERATION} {'on' if plugin_on else 'off'}"
            wrong.append(
                f"{engine}, {plugin}, taint {key}, {pool}: the API server leaves {live} "
                f"untolerated, the rule {rule}"
            )
    return wrong


def test_gate_tolerations_live_the_config_refuses_exactly_the_pools_that_strand_pods(
    planes: dict[bool, LocalControlPlane], tmp_path: Path
) -> None:
    wrong: list[str] = []
    judged = 0
    with opa_serving(tmp_path / "opa", CONFIG) as opa:
        for plugin_on, cp in planes.items():
            with _namespace(cp) as namespace:
                for engine in ADMISSION_ENGINES:
                    # Only the routing engine's toleration depends on the taint's key; the
                    # other engines' pods are the same for every key.
                    seen: dict[str, dict[str, list[dict[str, Any]]]] = {}
                    for key in TAINT_KEYS:
                        if engine == ROUTING_ENGINE or not seen:
                            seen[key] = _tolerations_by_resource(cp, engine, key, opa, namespace)
                        tolerations = seen.get(key) or next(iter(seen.values()))
                        wrong += _disagreements(engine, plugin_on, key, tolerations)
                        judged += len(POOLS)
    assert judged == len(planes) * len(ADMISSION_ENGINES) * len(TAINT_KEYS) * len(POOLS)
    assert not wrong, "\n".join(wrong)
