"""A fleet's pool on a real kube-apiserver: the gate's native policies with 20,000 pool nodes of
long names (about 0.9 MB of names) are accepted, though the API server compiles no CEL
expression over 100,000 code points, and they refuse a pod without a GPU bound to the last
pool node and admit one bound to another node. The nodes sit in variables of their own
(components/opa_gate/policies/gpu_scheduler_cel.py), so the routing policy's match
conditions and the webhook's, which inline what they use, stay small.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from components.opa_gate.manifests import gate_data, native_objects, webhook_condition
from components.opa_gate.policies.gpu_scheduler_cel import NODES_PER_VARIABLE_CHARS
from components.tainted_gpu_pool.settings import Taint
from tests.integration.conftest import require_tools
from tests.integration.gate_live import wait_for
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane

NODES = [f"gpu-node-{i:05d}.rack-{i // 16:04d}.prod.example.internal" for i in range(20_000)]
PARAMS = gate_data(
    "gpu-binpack-scheduler",
    [],
    [],
    pool_toleration=Taint().toleration(),
    pool_nodes=NODES,
    pool_namespaces=["monitoring"],
)
API = "/apis/admissionregistration.k8s.io/v1"
EXPRESSION_LIMIT = 100_000


def _expressions(spec: Any) -> list[str]:
    found = [v["expression"] for v in spec.get("variables", [])]
    found += [c["expression"] for c in spec.get("matchConditions", [])]
    return found


def test_pool_fence_scale_every_expression_fits_the_api_servers_limit() -> None:
    assert sum(len(n) for n in NODES) > 8 * NODES_PER_VARIABLE_CHARS
    for _, name, spec in native_objects(PARAMS, routing=True):
        assert max(map(len, _expressions(spec)), default=0) < EXPRESSION_LIMIT, name
    assert len(webhook_condition(PARAMS)) < EXPRESSION_LIMIT


@pytest.fixture(scope="module")
def control_plane() -> Iterator[LocalControlPlane]:
    require_tools(*CONTROL_PLANE_TOOLS)
    with LocalControlPlane() as cp:
        for collection, name, spec in native_objects(PARAMS, routing=True):
            cp.request("POST", f"{API}/{collection}", {"metadata": {"name": name}, "spec": spec})
        cp.create_namespace("team")
        yield cp


def _create(cp: LocalControlPlane, node: str) -> str | None:
    """Dry-run create of a CPU pod bound to `node`: None when admitted, else the refusal."""
    pod = {
        "metadata": {"name": "bound"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/x"}]},
    }
    try:
        cp.request("POST", "/api/v1/namespaces/team/pods?dryRun=All", pod)
    except urllib.error.HTTPError as exc:
        return exc.read().decode()
    return None


def test_pool_fence_scale_live_refuses_the_last_pool_node_and_admits_another(
    control_plane: LocalControlPlane,
) -> None:
    # The policies are enforced once the API server's informers have them.
    wait_for(
        "the pool fence in force",
        lambda: _create(control_plane, NODES[-1]) is not None,
        lambda: "the pod bound to the last pool node is still admitted",
    )
    refusal = _create(control_plane, NODES[-1]) or ""
    assert f"spec.nodeName is {NODES[-1]}, a node of the GPU pool" in refusal
    assert _create(control_plane, "cpu-1") is None
