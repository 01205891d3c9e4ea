"""tools/admission_plugins.py: the --help parser and the file it writes (no binary needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.control_plane_features import admission_plugins
from components.control_plane_features.admission_plugins import admission_plugins_for
from tools.admission_plugins import plugins_from_help, render

HELP = """
      --enable-admission-plugins strings             admission plugins that should be enabled in
                addition to default enabled ones (NamespaceLifecycle, LimitRanger). Comma-delimited
                list of admission plugins: AlwaysAdmit, ExtendedResourceToleration,
                NodeRestriction. The order of plugins in this flag does not matter.
"""


def test_admission_plugins_parses_the_list_after_the_flag_not_the_defaults() -> None:
    assert plugins_from_help(HELP) == [
        "AlwaysAdmit",
        "ExtendedResourceToleration",
        "NodeRestriction",
    ]


def test_admission_plugins_refuses_help_without_the_list() -> None:
    with pytest.raises(ValueError, match="no admission plugin list"):
        plugins_from_help("--enable-admission-plugins strings  admission plugins")


def test_admission_plugins_render_replaces_one_minor_and_keeps_the_others() -> None:
    table = {"1.36": {"version": "v1.36.3", "plugins": ["A"]}, "1.37": {"version": "v1.37.1"}}
    text = render(table, "v1.37.2", ["B", "C"])
    assert text.startswith("# Admission plugins each kube-apiserver minor accepts")
    assert yaml.safe_load(text) == {
        "1.36": {"version": "v1.36.3", "plugins": ["A"]},
        "1.37": {"version": "v1.37.2", "plugins": ["B", "C"]},
    }


def test_admission_plugins_for_a_minor_not_generated_is_the_nearest_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "admission-plugins.yaml"
    table.write_text(
        render({"1.33": {"version": "v1.33.9", "plugins": ["Old"]}}, "v1.37.2", ["New"])
    )
    monkeypatch.setattr(admission_plugins, "ADMISSION_PLUGINS_FILE", table)
    assert admission_plugins_for("v1.37.0") == ("v1.37.2", ("New",))
    assert admission_plugins_for("v1.36.3") == ("v1.37.2", ("New",))
    assert admission_plugins_for("v1.34.1") == ("v1.33.9", ("Old",))
    assert admission_plugins_for("v1.35.0") == ("v1.37.2", ("New",))  # a tie: the newer
    assert admission_plugins_for("not-a-version") == ("v1.37.2", ("New",))
