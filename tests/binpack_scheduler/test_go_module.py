"""The scheduler plugin's Go module (scheduler/) builds the same Kubernetes as the tools."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIRE = re.compile(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", re.MULTILINE)
REPLACE = re.compile(r"^\s*(k8s\.io/\S+)\s+=>\s+\S+\s+(v\S+)\s*$", re.MULTILINE)


def _go_mod(path: str) -> str:
    return (REPO_ROOT / path / "go.mod").read_text()


def test_scheduler_module_pins_the_kubernetes_of_the_tools() -> None:
    plugin, tools = _go_mod("scheduler"), _go_mod("tools/go/kubernetes")
    (version,) = REQUIRE.findall(tools)
    assert REQUIRE.findall(plugin) == [version]
    # Every staging module the plugin pins is at the tools' version.
    assert dict(REPLACE.findall(plugin)).items() <= dict(REPLACE.findall(tools)).items()
    assert "k8s.io/kube-scheduler" in dict(REPLACE.findall(plugin))
