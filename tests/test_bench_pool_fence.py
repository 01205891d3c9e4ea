"""bench.pool_fence's pure parts: the variants, their objects, the pods and a row's figures."""

from __future__ import annotations

import pytest

from bench.pool_fence import (
    FLOOR,
    OTHER_NODE,
    PODS,
    gate_objects,
    pod,
    pool_nodes,
    summarize,
    variants,
)
from components.opa_gate.manifests import written_document


def test_pool_fence_runs_the_floor_the_gate_then_each_fence() -> None:
    assert variants([1213, 20000]) == [
        (FLOOR, 0),
        ("gate", 0),
        ("fence-1213", 1213),
        ("fence-20000", 20000),
    ]


def test_pool_fence_names_are_46_characters_and_distinct() -> None:
    names = pool_nodes(20000)
    assert {len(n) for n in names} == {46}
    assert len(set(names)) == 20000


def test_pool_fence_the_floor_has_no_policy_and_each_fence_its_nodes() -> None:
    assert gate_objects(FLOOR, []) == []
    nodes = pool_nodes(5000)
    (validating,) = [
        s for c, _, s in gate_objects("fence-5000", nodes) if c == "validatingadmissionpolicies"
    ]
    assert written_document(validating)["pool_nodes"].split(",") == sorted(nodes)
    (plain,) = [s for c, _, s in gate_objects("gate", []) if c == "validatingadmissionpolicies"]
    assert "pool_nodes" not in written_document(plain)


def test_pool_fence_pods_are_cpu_pods_bound_as_named() -> None:
    last = pool_nodes(3)[-1]
    specs = {kind: pod(kind, last)["spec"] for kind in PODS}
    assert specs["bound-to-the-last-pool-node"]["nodeName"] == last
    assert specs["bound-to-another-node"]["nodeName"] == OTHER_NODE
    assert "nodeName" not in specs["unbound"]
    for spec in specs.values():
        (container,) = spec["containers"]
        assert set(container["resources"]["requests"]) == {"cpu"}


def test_pool_fence_a_row_has_the_median_p95_refusals_and_the_ratio_to_the_floor() -> None:
    samples = [(0.001 * i, i % 2 == 0) for i in range(1, 21)]  # 1..20 ms, every other refused
    row = summarize("fence-5", 5, "unbound", samples, floor_ms=5.25)
    assert (row.creates, row.refused) == (20, 10)
    assert row.median_ms == pytest.approx(10.5)
    assert row.p95_ms == pytest.approx(19.0)
    assert row.vs_floor == pytest.approx(2.0)
