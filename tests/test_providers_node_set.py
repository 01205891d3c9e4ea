"""The node-set mechanics shared by the node layers' providers (components/providers/node_set.py)."""

from __future__ import annotations

import threading
import time

from components.providers.node_api import NodeApiError
from components.providers.node_set import failure_message, for_each_node, merge_patches


def test_node_set_runs_every_node_and_collects_each_failure_by_node() -> None:
    def patch(node: str) -> str:
        if node == "gpu-2":
            raise NodeApiError("cannot patch node 'gpu-2' (HTTP 500)")
        if node == "gpu-4":
            raise KeyError("status")
        return node.upper()

    done, failed = for_each_node([f"gpu-{i}" for i in range(6)], patch)
    assert sorted(done) == ["gpu-0", "gpu-1", "gpu-3", "gpu-5"] and done["gpu-0"] == "GPU-0"
    assert failed == {
        "gpu-2": "cannot patch node 'gpu-2' (HTTP 500)",
        "gpu-4": "KeyError: 'status'",
    }


def test_node_set_keeps_at_most_the_given_number_of_calls_in_flight() -> None:
    lock, running, peak = threading.Lock(), [0], [0]

    def patch(_node: str) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    for_each_node([str(i) for i in range(40)], patch, workers=4)
    assert 1 < peak[0] <= 4


def test_node_set_failure_message_names_every_node_sorted_one_per_line() -> None:
    message = failure_message("undo it", {"gpu-9": "gone", "gpu-10": "refused"}, 12)
    assert message.splitlines() == [
        "undo it: 2 of 12 nodes failed, the others are done:",
        "  gpu-10: refused",
        "  gpu-9: gone",
    ]


def test_node_set_merge_patches_merges_nested_maps_and_keeps_removals() -> None:
    merged = merge_patches(
        {"spec": {"taints": [{"key": "a"}]}, "metadata": {"annotations": {"x": "1"}}},
        None,
        {"metadata": {"labels": {"pool": None}, "annotations": {"y": None}}},
    )
    assert merged == {
        "spec": {"taints": [{"key": "a"}]},
        "metadata": {"annotations": {"x": "1", "y": None}, "labels": {"pool": None}},
    }
    assert merge_patches(None, {}) is None
