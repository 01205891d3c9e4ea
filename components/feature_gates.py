"""Which feature gates a Kubernetes version knows.

kube-apiserver and the kubelet refuse to start on a feature gate name they do not know, so the
config loader rejects one before anything is applied. feature_gates.json lists every gate of the
newest supported Kubernetes with the minor version it appeared in (tools/feature_gates.py writes
it from the Kubernetes sources). Gates with a recorded lifecycle in the host editor
(kube_flags_edit.GATE_LIFECYCLE, removed ones included) are left to its version filter, which
leaves out locked, removed and not-yet-introduced gates with a warning.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.hostscripts.kube_flags_edit import GATE_LIFECYCLE, parse_version

DATA_FILE = Path(__file__).resolve().parent / "feature_gates.json"
# Accepted by every component's --feature-gates whatever the version.
ALWAYS_KNOWN = ("AllAlpha", "AllBeta")


def _load() -> tuple[str, dict[str, tuple[int, int]]]:
    data = json.loads(DATA_FILE.read_text())
    return str(data["source"]), {k: parse_version(v) for k, v in data["gates"].items()}


SOURCE, FIRST_VERSION = _load()
"""Where the list comes from (e.g. "Kubernetes v1.37.2"), and {gate: (1, minor) it appeared in}."""


def unknown_gate_problem(name: str, version: str) -> str | None:
    """Why gate `name` cannot be set on a cluster of `version`, or None when it can."""
    if name in ALWAYS_KNOWN or name in GATE_LIFECYCLE:
        return None
    first = FIRST_VERSION.get(name)
    if first is None:
        return (
            f"not a feature gate known to {SOURCE}; kube-apiserver and the kubelet refuse "
            "to start on an unknown gate"
        )
    major, minor = parse_version(version)
    if (major, minor) < first:
        return (
            f"this gate first appears in v{first[0]}.{first[1]}, so kubernetesVersion "
            f"v{major}.{minor} does not know it; kube-apiserver would refuse to start"
        )
    return None
