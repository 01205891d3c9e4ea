"""Which admission plugins a Kubernetes version's kube-apiserver knows.

kube-apiserver does not start with an unknown name in --enable-admission-plugins, so the config
loader refuses one first. admission-plugins.yaml lists the names per minor, written by
tools/admission_plugins.py from `kube-apiserver --help`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.kubernetes_version import major_minor

ADMISSION_PLUGINS_FILE = Path(__file__).resolve().parent / "admission-plugins.yaml"
"""Admission plugin names per Kubernetes minor, written by tools/admission_plugins.py from
`kube-apiserver --help` (an unknown name stops the API server, so config refuses it first)."""


def admission_plugins_for(version: str) -> tuple[str, tuple[str, ...]]:
    """(kube-apiserver version the names came from, the names) for `version`'s minor.

    A minor with no generated list gets the nearest one (the caller says so).
    """
    table: dict[str, Any] = yaml.safe_load(ADMISSION_PLUGINS_FILE.read_text())
    parsed = major_minor(version)
    wanted = parsed[1] if parsed and parsed[0] == 1 else None
    minors = {int(k.split(".")[1]): k for k in table}
    best = max(minors) if wanted is None else min(minors, key=lambda m: (abs(m - wanted), -m))
    entry = table[minors[best]]
    return str(entry["version"]), tuple(entry["plugins"])
