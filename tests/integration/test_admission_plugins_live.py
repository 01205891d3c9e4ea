"""components/control_plane_features/admission-plugins.yaml is what the built kube-apiserver says, not a stale copy."""

from __future__ import annotations

import yaml

from components.control_plane_features.admission_plugins import ADMISSION_PLUGINS_FILE
from tests.integration.conftest import built_tool
from tools.admission_plugins import binary_facts, main


def test_admission_plugins_file_is_current_for_the_built_kube_apiserver() -> None:
    apiserver = built_tool("kube-apiserver")
    assert main(["--apiserver", str(apiserver), "--check"]) == 0, (
        "stale: run python -m tools.admission_plugins"
    )


def test_admission_plugins_from_help_include_the_ones_the_stacks_use() -> None:
    version, plugins = binary_facts(built_tool("kube-apiserver"))
    assert "ExtendedResourceToleration" in plugins
    assert "NodeRestriction" in plugins
    minor = ".".join(version.lstrip("v").split(".")[:2])
    table = yaml.safe_load(ADMISSION_PLUGINS_FILE.read_text())
    assert table[minor] == {"version": version, "plugins": plugins}
