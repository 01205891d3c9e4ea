"""Which feature gates a Kubernetes version knows.

kube-apiserver and the kubelet refuse to start on a feature gate name they do not know, so the
config loader rejects one before anything is applied. feature_gates.json lists every gate of the
newest supported Kubernetes with the minor version it appeared in (tools/feature_gates.py writes
it from the Kubernetes sources). Whether a known gate is locked on the running cluster is asked
of the cluster itself at preview (ControlPlaneFeatures' check of `kubernetes_feature_enabled`).
"""

from __future__ import annotations

import json
from pathlib import Path

from components.kubernetes_version import major_minor

DATA_FILE = Path(__file__).resolve().parent / "feature_gates.json"
# Accepted by every component's --feature-gates whatever the version.
ALWAYS_KNOWN = ("AllAlpha", "AllBeta")


def _first_version(gate: str, version: str) -> tuple[int, int]:
    parsed = major_minor(version)
    if parsed is None:
        raise ValueError(f"{DATA_FILE}: gate {gate} has no MAJOR.MINOR version: {version!r}")
    return parsed


def _load() -> tuple[str, dict[str, tuple[int, int]]]:
    data = json.loads(DATA_FILE.read_text())
    return str(data["source"]), {k: _first_version(k, v) for k, v in data["gates"].items()}


SOURCE, FIRST_VERSION = _load()
"""Where the list comes from (e.g. "Kubernetes v1.37.2"), and {gate: (1, minor) it appeared in}."""


def unknown_gate_problem(name: str, version: str) -> str | None:
    """Why gate `name` cannot be set on a cluster of `version`, or None when it can."""
    if name in ALWAYS_KNOWN:
        return None
    first = FIRST_VERSION.get(name)
    if first is None:
        return (
            f"not a feature gate known to {SOURCE}; kube-apiserver and the kubelet refuse "
            "to start on an unknown gate"
        )
    wanted = major_minor(version)
    if wanted is not None and wanted < first:
        return (
            f"this gate first appears in v{first[0]}.{first[1]}, so kubernetesVersion "
            f"v{wanted[0]}.{wanted[1]} does not know it; kube-apiserver would refuse to start"
        )
    return None
