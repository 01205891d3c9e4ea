"""Tests of components/hostscripts/kube_flags_edit.py, the host-side editor of kubeadm files.

The module is loaded from its file path (it is shipped to hosts as a single file and must not
depend on the components package), and the command line is exercised in a subprocess running
``python3 -I -S`` so that only the standard library is importable.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "components" / "hostscripts" / "kube_flags_edit.py"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kubeadm"
VERSIONS = ("v1.33", "v1.34", "v1.35")
PYTHON3 = shutil.which("python3") or sys.executable


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kube_flags_edit_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kfe = _load()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def command_of(text: str) -> list[str]:
    doc = yaml.safe_load(text)
    (container,) = doc["spec"]["containers"]
    return list(container["command"])


def flag(command: list[str], name: str) -> str | None:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) <= 1
    return values[0] if values else None


def apply(target: str, text: str, **kwargs: Any) -> Any:
    return kfe.apply_edit(target, text, **kwargs)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON3, "-I", "-S", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=60,
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    result: dict[str, Any] = json.loads(lines[0])
    return result


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A fake control-plane host: a manifests dir with kubeadm's v1.34 apiserver manifest."""
    manifests = tmp_path / "etc" / "kubernetes" / "manifests"
    manifests.mkdir(parents=True)
    manifest = manifests / "kube-apiserver.yaml"
    manifest.write_text(fixture("v1.34/kube-apiserver.yaml"), encoding="utf-8")
    return {
        "manifests": manifests,
        "manifest": manifest,
        "state": tmp_path / "var" / "lib" / "gpu-cluster" / "apiserver-state.json",
        "backups": tmp_path / "var" / "lib" / "gpu-cluster" / "backups",
    }


def cli_apply(host: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "apiserver-manifest",
        "apply",
        "--file",
        str(host["manifest"]),
        "--state",
        str(host["state"]),
        "--backup-dir",
        str(host["backups"]),
        *extra,
    )


def cli_revert(host: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "apiserver-manifest",
        "revert",
        "--file",
        str(host["manifest"]),
        "--state",
        str(host["state"]),
        "--backup-dir",
        str(host["backups"]),
    )


GPU_ARGS = (
    "--admission-plugins",
    "ExtendedResourceToleration",
    "--feature-gates",
    "InPlacePodVerticalScaling=true",
)

# --------------------------------------------------------------------------------------------
# The program itself: stdlib-only, Python 3.8 syntax, importable without side effects
# --------------------------------------------------------------------------------------------


def _source_tree() -> ast.Module:
    return ast.parse(SCRIPT.read_text(encoding="utf-8"))


def test_program_imports_only_stdlib_modules() -> None:
    imported: set[str] = set()
    for node in ast.walk(_source_tree()):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports do not work in a single shipped file"
            assert node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported, "no imports found"
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_program_parses_with_python38_grammar() -> None:
    ast.parse(SCRIPT.read_text(encoding="utf-8"), feature_version=(3, 8))


def _annotation_node_ids(tree: ast.Module) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        annotations = [getattr(node, "annotation", None), getattr(node, "returns", None)]
        if isinstance(node, ast.arguments):
            every = [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg]
            annotations += [arg.annotation for arg in every if arg is not None]
        for annotation in annotations:
            if annotation is not None:
                ids.update(id(sub) for sub in ast.walk(annotation))
    return ids


def test_program_avoids_apis_newer_than_python38() -> None:
    # Annotations are never evaluated (from __future__ import annotations), so `X | None` and
    # `dict[str, int]` are fine there; anywhere else they would fail on Python 3.8.
    assert "from __future__ import annotations" in SCRIPT.read_text(encoding="utf-8")
    tree = _source_tree()
    in_annotations = _annotation_node_ids(tree)
    newer_attributes = {"removeprefix", "removesuffix", "cache", "pairwise", "bit_count"}
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute):
            assert node.attr not in newer_attributes, f"{where}: .{node.attr}"
        if isinstance(node, ast.Call):
            assert all(kw.arg != "strict" for kw in node.keywords), f"{where}: strict="
        if id(node) in in_annotations:
            continue
        if isinstance(node, ast.BinOp):
            assert not isinstance(node.op, ast.BitOr), f"{where}: runtime X | Y"
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            builtin_generics = ("dict", "list", "tuple", "set", "frozenset", "type")
            assert node.value.id not in builtin_generics, f"{where}: runtime {node.value.id}[...]"


def test_program_import_has_no_side_effects() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(SCRIPT)!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(sorted(k for k in ('filter_gates', 'GATE_LIFECYCLE', 'main') if hasattr(m, k)))\n"
    )
    proc = subprocess.run(
        [PYTHON3, "-I", "-S", "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout.strip() == "['GATE_LIFECYCLE', 'filter_gates', 'main']"
    assert proc.stderr == ""


# --------------------------------------------------------------------------------------------
# Feature gate lifecycle
# --------------------------------------------------------------------------------------------


def test_filter_gates_keeps_in_place_pod_vertical_scaling_on_v1_33() -> None:
    kept, warnings = kfe.filter_gates({"InPlacePodVerticalScaling": True}, "v1.33.4")
    assert kept == {"InPlacePodVerticalScaling": True}
    assert warnings == []


def test_filter_gates_drops_in_place_pod_vertical_scaling_on_v1_35_with_warning() -> None:
    kept, warnings = kfe.filter_gates({"InPlacePodVerticalScaling": True}, "v1.35.0")
    assert kept == {}
    assert warnings == [
        "feature gate InPlacePodVerticalScaling is GA and locked on in v1.35; leaving it out"
    ]


@pytest.mark.parametrize(
    ("gate", "version", "kept"),
    [
        ("SidecarContainers", "v1.32.9", True),
        ("SidecarContainers", "v1.33.0", False),
        ("DynamicResourceAllocation", "v1.34.2", True),
        ("DynamicResourceAllocation", "v1.35.0", False),
        ("PodLevelResources", "v1.34.2", True),
    ],
)
def test_filter_gates_follows_the_lifecycle_table(gate: str, version: str, kept: bool) -> None:
    result, warnings = kfe.filter_gates({gate: "true"}, version)
    assert (gate in result) is kept
    assert len(warnings) == (0 if kept else 1)


def test_filter_gates_passes_unknown_gates_without_warning() -> None:
    kept, warnings = kfe.filter_gates({"SomeVendorGate": False, "HPAScaleToZero": True}, "v1.35.0")
    assert kept == {"SomeVendorGate": False, "HPAScaleToZero": True}
    assert warnings == []


def test_filter_gates_drops_a_gate_not_introduced_yet() -> None:
    kept, warnings = kfe.filter_gates({"PodLevelResources": True}, "1.31")
    assert kept == {}
    assert warnings == [
        "feature gate PodLevelResources does not exist in v1.31 (it appears as alpha in v1.32); "
        "leaving it out"
    ]


def test_filter_gates_without_version_keeps_everything() -> None:
    gates = {"InPlacePodVerticalScaling": True, "SidecarContainers": True}
    assert kfe.filter_gates(gates, None) == (gates, [])


@pytest.mark.parametrize(
    ("version", "expected"),
    [("v1.34.2", (1, 34)), ("1.33", (1, 33)), ("v1.35.0-rc.1", (1, 35)), ("v1.30.1+k3s1", (1, 30))],
)
def test_parse_version_accepts_kubernetes_versions(version: str, expected: tuple[int, int]) -> None:
    assert kfe.parse_version(version) == expected


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        kfe.parse_version("latest")


def test_gate_lifecycle_table_is_well_formed() -> None:
    for name, lifecycle in kfe.GATE_LIFECYCLE.items():
        versions = [kfe.parse_version(stage.since) for stage in lifecycle.stages]
        assert versions == sorted(versions), name
        assert all(s.stage in ("alpha", "beta", "ga", "deprecated") for s in lifecycle.stages)
        assert not any(s.locked and s.stage in ("alpha", "beta") for s in lifecycle.stages), name


# --------------------------------------------------------------------------------------------
# apiserver-manifest
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_apiserver_manifest_merges_admission_plugins_keeping_existing(version: str) -> None:
    result = apply(
        "apiserver-manifest",
        fixture(f"{version}/kube-apiserver.yaml"),
        admission_plugins=["ExtendedResourceToleration", "PodNodeSelector"],
    )
    command = command_of(result.text)
    assert flag(command, "enable-admission-plugins") == (
        "NodeRestriction,ExtendedResourceToleration,PodNodeSelector"
    )
    assert result.added == [
        "enable-admission-plugins:ExtendedResourceToleration",
        "enable-admission-plugins:PodNodeSelector",
    ]


def test_apiserver_manifest_does_not_duplicate_an_existing_plugin() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("v1.34/kube-apiserver.yaml"),
        admission_plugins=["NodeRestriction", "ExtendedResourceToleration"],
    )
    assert flag(command_of(result.text), "enable-admission-plugins") == (
        "NodeRestriction,ExtendedResourceToleration"
    )
    assert result.state["settings"]["enable-admission-plugins"]["added"] == {
        "ExtendedResourceToleration": None
    }


def test_apiserver_manifest_adds_feature_gates_flag_in_kubeadm_sorted_order() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("v1.34/kube-apiserver.yaml"),
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    command = command_of(result.text)
    assert command[1:] == sorted(command[1:])
    assert "--feature-gates=InPlacePodVerticalScaling=true" in command
    assert result.state["settings"]["feature-gates"]["created"] is True


def test_apiserver_manifest_merges_gates_keeping_existing_ones() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("edge/kube-apiserver-edited.yaml"),
        feature_gates={"DynamicResourceAllocation": True},
    )
    assert flag(command_of(result.text), "feature-gates") == (
        "InPlacePodVerticalScaling=true,HPAScaleToZero=false,DynamicResourceAllocation=true"
    )


def test_apiserver_manifest_configured_gate_value_wins_and_old_value_is_recorded() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("edge/kube-apiserver-edited.yaml"),
        feature_gates={"HPAScaleToZero": True},
    )
    assert flag(command_of(result.text), "feature-gates") == (
        "InPlacePodVerticalScaling=true,HPAScaleToZero=true"
    )
    assert result.changed_values == {
        "feature-gates:HPAScaleToZero": {"old": "false", "new": "true"}
    }
    assert result.state["settings"]["feature-gates"]["changed"] == {
        "HPAScaleToZero": {"old": "false", "new": "true"}
    }


def test_apiserver_manifest_adds_missing_plugins_flag_with_only_configured_plugins() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("edge/kube-apiserver-no-admission-plugins.yaml"),
        admission_plugins=["ExtendedResourceToleration"],
    )
    command = command_of(result.text)
    assert flag(command, "enable-admission-plugins") == "ExtendedResourceToleration"
    assert command[1:] == sorted(command[1:])
    assert result.state["settings"]["enable-admission-plugins"]["created"] is True


def test_apiserver_manifest_already_present_entries_are_not_claimed() -> None:
    text = fixture("edge/kube-apiserver-edited.yaml")
    result = apply(
        "apiserver-manifest",
        text,
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    assert result.text == text
    assert not result.changed
    reverted = kfe.revert_edit("apiserver-manifest", result.text, result.state)
    assert reverted.text == text


@pytest.mark.parametrize("version", VERSIONS)
def test_apiserver_manifest_second_apply_is_byte_identical_and_unchanged(version: str) -> None:
    kwargs: dict[str, Any] = {
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": {"InPlacePodVerticalScaling": True, "HPAScaleToZero": False},
    }
    first = apply("apiserver-manifest", fixture(f"{version}/kube-apiserver.yaml"), **kwargs)
    second = apply("apiserver-manifest", first.text, state=first.state, **kwargs)
    assert first.changed
    assert second.text == first.text
    assert not second.changed
    assert second.state == first.state
    assert (second.added, second.removed, second.changed_values) == ([], [], {})


APISERVER_FIXTURES = [
    *(f"{v}/kube-apiserver.yaml" for v in VERSIONS),
    "edge/kube-apiserver-edited.yaml",
    "edge/kube-apiserver-no-admission-plugins.yaml",
    "edge/kube-apiserver-comments-whitespace.yaml",
]


@pytest.mark.parametrize("name", APISERVER_FIXTURES)
def test_apiserver_manifest_revert_restores_byte_identical_file(name: str) -> None:
    original = fixture(name)
    applied = apply(
        "apiserver-manifest",
        original,
        admission_plugins=["ExtendedResourceToleration", "NodeRestriction"],
        feature_gates={"InPlacePodVerticalScaling": True, "HPAScaleToZero": True},
    )
    assert applied.changed
    reverted = kfe.revert_edit("apiserver-manifest", applied.text, applied.state)
    assert reverted.text == original
    assert reverted.state is None


def test_apiserver_manifest_revert_keeps_human_edits_made_in_between() -> None:
    original = fixture("v1.34/kube-apiserver.yaml")
    applied = apply(
        "apiserver-manifest",
        original,
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    edited = applied.text.replace(
        "NodeRestriction,ExtendedResourceToleration",
        "NodeRestriction,ExtendedResourceToleration,PodNodeSelector",
    ).replace(
        "InPlacePodVerticalScaling=true", "InPlacePodVerticalScaling=true,HPAScaleToZero=true"
    )
    edited = edited.replace("--secure-port=6443", "--secure-port=6444")
    reverted = kfe.revert_edit("apiserver-manifest", edited, applied.state)
    command = command_of(reverted.text)
    assert flag(command, "enable-admission-plugins") == "NodeRestriction,PodNodeSelector"
    assert flag(command, "feature-gates") == "HPAScaleToZero=true"
    assert flag(command, "secure-port") == "6444"


def test_apiserver_manifest_revert_leaves_a_value_a_human_changed() -> None:
    applied = apply(
        "apiserver-manifest",
        fixture("edge/kube-apiserver-edited.yaml"),
        feature_gates={"HPAScaleToZero": True, "DynamicResourceAllocation": True},
    )
    edited = applied.text.replace(
        "DynamicResourceAllocation=true", "DynamicResourceAllocation=false"
    )
    reverted = kfe.revert_edit("apiserver-manifest", edited, applied.state)
    assert flag(command_of(reverted.text), "feature-gates") == (
        "InPlacePodVerticalScaling=true,HPAScaleToZero=false,DynamicResourceAllocation=false"
    )
    assert reverted.warnings == [
        "feature-gates: DynamicResourceAllocation was changed by someone else after it was "
        "added; leaving it"
    ]


def test_apiserver_manifest_converges_when_configured_gates_shrink() -> None:
    original = fixture("v1.34/kube-apiserver.yaml")
    first = apply(
        "apiserver-manifest",
        original,
        feature_gates={"InPlacePodVerticalScaling": True, "DynamicResourceAllocation": True},
    )
    second = apply(
        "apiserver-manifest",
        first.text,
        state=first.state,
        feature_gates={"DynamicResourceAllocation": True},
    )
    assert flag(command_of(second.text), "feature-gates") == "DynamicResourceAllocation=true"
    assert second.removed == ["feature-gates:InPlacePodVerticalScaling=true"]
    third = apply("apiserver-manifest", second.text, state=second.state)
    assert third.text == original
    assert third.state["settings"]["feature-gates"] == {
        "created": False,
        "original": None,
        "seeded": [],
        "added": {},
        "changed": {},
    }


def test_apiserver_manifest_converging_restores_a_gate_value_it_changed() -> None:
    original = fixture("edge/kube-apiserver-edited.yaml")
    first = apply("apiserver-manifest", original, feature_gates={"HPAScaleToZero": True})
    second = apply("apiserver-manifest", first.text, state=first.state, feature_gates={})
    assert second.text == original
    assert second.changed_values == {
        "feature-gates:HPAScaleToZero": {"old": "true", "new": "false"}
    }


def test_apiserver_manifest_preserves_comments_quotes_and_odd_whitespace() -> None:
    original = fixture("edge/kube-apiserver-comments-whitespace.yaml")
    result = apply(
        "apiserver-manifest",
        original,
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    before, after = original.splitlines(), result.text.splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]  # noqa: B905 - same length
    assert len(before) == len(after)
    assert changed == [
        (
            '      - "--enable-admission-plugins=NodeRestriction,PodNodeSelector"   '
            "# quoted on purpose",
            '      - "--enable-admission-plugins=NodeRestriction,PodNodeSelector,'
            'ExtendedResourceToleration"   # quoted on purpose',
        ),
        (
            '      - "--feature-gates=HPAScaleToZero=true"',
            '      - "--feature-gates=HPAScaleToZero=true,InPlacePodVerticalScaling=true"',
        ),
    ]
    assert "-   --advertise-address=192.168.10.12   " in result.text


def test_apiserver_manifest_new_flag_line_uses_the_list_indentation() -> None:
    original = fixture("edge/kube-apiserver-comments-whitespace.yaml").replace(
        '      - "--feature-gates=HPAScaleToZero=true"\n', ""
    )
    result = apply(
        "apiserver-manifest", original, feature_gates={"InPlacePodVerticalScaling": True}
    )
    assert "\n      - --feature-gates=InPlacePodVerticalScaling=true\n" in result.text
    command = command_of(result.text)
    assert command[-1] == "--feature-gates=InPlacePodVerticalScaling=true"


@pytest.mark.parametrize("version", VERSIONS)
def test_apiserver_manifest_edit_still_parses_and_command_is_as_expected(version: str) -> None:
    original = fixture(f"{version}/kube-apiserver.yaml")
    result = apply(
        "apiserver-manifest",
        original,
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
        kubernetes_version=f"{version}.0",
    )
    expected = command_of(original)
    expected[expected.index("--enable-admission-plugins=NodeRestriction")] = (
        "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration"
    )
    if version != "v1.35":
        expected.append("--feature-gates=InPlacePodVerticalScaling=true")
        expected[1:] = sorted(expected[1:])
    assert command_of(result.text) == expected
    before, after = yaml.safe_load(original), yaml.safe_load(result.text)
    before["spec"]["containers"][0].pop("command")
    after["spec"]["containers"][0].pop("command")
    assert after == before


def test_apiserver_manifest_version_filter_leaves_locked_gate_out_with_warning() -> None:
    result = apply(
        "apiserver-manifest",
        fixture("v1.35/kube-apiserver.yaml"),
        feature_gates={"InPlacePodVerticalScaling": True},
        kubernetes_version="v1.35.0",
    )
    assert not result.changed
    assert flag(command_of(result.text), "feature-gates") is None
    assert result.warnings == [
        "feature gate InPlacePodVerticalScaling is GA and locked on in v1.35; leaving it out"
    ]


def test_apiserver_manifest_handles_crlf_line_endings() -> None:
    original = fixture("v1.34/kube-apiserver.yaml").replace("\n", "\r\n")
    result = apply(
        "apiserver-manifest", original, feature_gates={"InPlacePodVerticalScaling": True}
    )
    assert "\r\n    - --feature-gates=InPlacePodVerticalScaling=true\r\n" in result.text
    assert "\n" not in result.text.replace("\r\n", "")
    assert kfe.revert_edit("apiserver-manifest", result.text, result.state).text == original


def test_apiserver_manifest_keeps_a_missing_final_newline() -> None:
    original = fixture("v1.34/kube-apiserver.yaml").rstrip("\n")
    result = apply("apiserver-manifest", original, admission_plugins=["ExtendedResourceToleration"])
    assert not result.text.endswith("\n")
    assert kfe.revert_edit("apiserver-manifest", result.text, result.state).text == original


def _swap(old: str, new: str) -> str:
    text = fixture("v1.34/kube-apiserver.yaml")
    assert old in text
    return text.replace(old, new)


APISERVER_REFUSALS = [
    (fixture("edge/kube-apiserver-duplicate-flag.yaml"), "--feature-gates appears 2 times"),
    (fixture("edge/kube-apiserver-tabs.yaml"), "tab character in indentation"),
    (fixture("edge/kube-apiserver-flow-command.yaml"), "not a block-style list"),
    (fixture("edge/kube-apiserver.json"), "looks like JSON or flow-style YAML"),
    (fixture("edge/kube-apiserver-unparseable.yaml"), "unexpected top-level content"),
    (fixture("v1.34/kubelet-config.yaml"), "not a Pod manifest"),
    (_swap("    - kube-apiserver\n", "    - etcd\n"), "no kube-apiserver command list found"),
    (
        _swap(
            "    - --enable-admission-plugins=NodeRestriction\n",
            "    - --enable-admission-plugins\n    - NodeRestriction\n",
        ),
        "without '=value'",
    ),
    (
        _swap("    - --secure-port=6443\n", "    - --secure-port=6443\n      --v=2\n"),
        "unexpected line in the kube-apiserver command list",
    ),
    (_swap("kind: Pod\n", "kind: Pod\r\n"), "mixed line endings"),
    (_swap("status: {}\n", "status: {}\n---\nkind: Pod\n"), "more than one YAML document"),
    (_swap("    - --secure-port=6443\n", "    - *port\n"), "unsupported YAML construct"),
    (
        _swap("    image: ", "    args:\n    - --feature-gates=A=true\n    image: "),
        "--feature-gates also appears outside the kube-apiserver command list",
    ),
    (
        _swap("    - --secure-port=6443\n", "    - --secure-port=6443\n    - --feature-gates=A\n"),
        "item 'A' has no '=value'",
    ),
]


@pytest.mark.parametrize(("text", "reason"), APISERVER_REFUSALS)
def test_apiserver_manifest_refuses_what_it_cannot_parse_confidently(
    text: str, reason: str
) -> None:
    with pytest.raises(kfe.Refusal) as excinfo:
        apply("apiserver-manifest", text, feature_gates={"InPlacePodVerticalScaling": True})
    assert reason in str(excinfo.value)


# --------------------------------------------------------------------------------------------
# kubelet-config
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_kubelet_config_adds_feature_gates_block_in_kubeadm_sorted_position(version: str) -> None:
    original = fixture(f"{version}/kubelet-config.yaml")
    result = apply("kubelet-config", original, feature_gates={"InPlacePodVerticalScaling": True})
    assert (
        "evictionPressureTransitionPeriod: 0s\n"
        "featureGates:\n"
        "  InPlacePodVerticalScaling: true\n"
        "fileCheckFrequency: 0s\n"
    ) in result.text
    doc = yaml.safe_load(result.text)
    assert doc["featureGates"] == {"InPlacePodVerticalScaling": True}
    assert doc == {**yaml.safe_load(original), "featureGates": {"InPlacePodVerticalScaling": True}}


def test_kubelet_config_appends_block_at_end_when_keys_are_not_sorted() -> None:
    original = "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
    result = apply("kubelet-config", original, feature_gates={"InPlacePodVerticalScaling": True})
    assert result.text == original + "featureGates:\n  InPlacePodVerticalScaling: true\n"


def test_kubelet_config_merges_into_existing_block_keeping_other_gates_and_comments() -> None:
    original = fixture("edge/kubelet-config-feature-gates.yaml")
    result = apply(
        "kubelet-config",
        original,
        feature_gates={"InPlacePodVerticalScaling": True, "MemoryQoS": True},
    )
    assert (
        "featureGates:\n"
        "  InPlacePodVerticalScaling: true\n"
        "  KubeletPSI: true  # node pressure metrics\n"
        "  MemoryQoS: true\n"
    ) in result.text
    assert result.changed_values == {"featureGates:MemoryQoS": {"old": "false", "new": "true"}}
    assert result.added == ["featureGates:InPlacePodVerticalScaling=true"]


def test_kubelet_config_expands_empty_flow_mapping_and_revert_restores_it() -> None:
    original = fixture("edge/kubelet-config-empty-gates.yaml")
    result = apply("kubelet-config", original, feature_gates={"InPlacePodVerticalScaling": True})
    assert "featureGates:\n  InPlacePodVerticalScaling: true\nmemorySwap: {}\n" in result.text
    assert result.state["settings"]["featureGates"]["original"] == "featureGates: {}"
    assert kfe.revert_edit("kubelet-config", result.text, result.state).text == original


@pytest.mark.parametrize(
    "name",
    [
        *(f"{v}/kubelet-config.yaml" for v in VERSIONS),
        "edge/kubelet-config-feature-gates.yaml",
        "edge/kubelet-config-empty-gates.yaml",
    ],
)
def test_kubelet_config_apply_is_idempotent_and_revert_byte_identical(name: str) -> None:
    original = fixture(name)
    gates = {"InPlacePodVerticalScaling": True, "MemoryQoS": True}
    first = apply("kubelet-config", original, feature_gates=gates)
    second = apply("kubelet-config", first.text, state=first.state, feature_gates=gates)
    assert first.changed and not second.changed
    assert second.text == first.text
    assert kfe.revert_edit("kubelet-config", second.text, second.state).text == original


def test_kubelet_config_revert_keeps_a_gate_a_human_added() -> None:
    original = fixture("v1.34/kubelet-config.yaml")
    applied = apply("kubelet-config", original, feature_gates={"InPlacePodVerticalScaling": True})
    edited = applied.text.replace(
        "  InPlacePodVerticalScaling: true\n",
        "  InPlacePodVerticalScaling: true\n  KubeletPSI: true\n",
    )
    reverted = kfe.revert_edit("kubelet-config", edited, applied.state)
    assert yaml.safe_load(reverted.text)["featureGates"] == {"KubeletPSI": True}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (fixture("edge/kubelet-config-flow-gates.yaml"), "featureGates is a flow-style mapping"),
        (fixture("edge/kube-proxy-config.yaml"), "not a KubeletConfiguration"),
        (
            fixture("edge/kubelet-config-feature-gates.yaml").replace(
                "  MemoryQoS: false\n", "  MemoryQoS: false\n  KubeletPSI: false\n"
            ),
            "duplicate key 'KubeletPSI' in featureGates",
        ),
        (
            fixture("v1.34/kubelet-config.yaml") + "cgroupDriver: cgroupfs\n",
            "duplicate top-level key 'cgroupDriver'",
        ),
        (
            fixture("edge/kubelet-config-feature-gates.yaml").replace(
                "  MemoryQoS: false\n", "  MemoryQoS:\n    enabled: false\n"
            ),
            "unexpected nested value in featureGates",
        ),
    ],
)
def test_kubelet_config_refuses_what_it_cannot_parse_confidently(text: str, reason: str) -> None:
    with pytest.raises(kfe.Refusal) as excinfo:
        apply("kubelet-config", text, feature_gates={"InPlacePodVerticalScaling": True})
    assert reason in str(excinfo.value)


# --------------------------------------------------------------------------------------------
# kubeadm-config (ClusterConfiguration)
# --------------------------------------------------------------------------------------------


def extra_args(text: str) -> Any:
    return yaml.safe_load(text)["apiServer"]["extraArgs"]


@pytest.mark.parametrize("version", VERSIONS)
def test_kubeadm_config_v1beta4_expands_empty_api_server_into_name_value_list(version: str) -> None:
    original = fixture(f"{version}/cluster-configuration.yaml")
    result = apply(
        "kubeadm-config",
        original,
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"DynamicResourceAllocation": True},
    )
    assert result.text.startswith(
        "apiServer:\n"
        "  extraArgs:\n"
        "  - name: enable-admission-plugins\n"
        "    value: NodeRestriction,ExtendedResourceToleration\n"
        "  - name: feature-gates\n"
        "    value: DynamicResourceAllocation=true\n"
        "apiVersion: kubeadm.k8s.io/v1beta4\n"
    )
    assert result.state["containers"] == {
        "apiServer": {"created": False, "original": "apiServer: {}"},
        "apiServer.extraArgs": {"created": True, "original": None},
    }


def test_kubeadm_config_new_admission_plugins_arg_keeps_kubeadm_default_node_restriction() -> None:
    result = apply(
        "kubeadm-config",
        fixture("edge/cluster-configuration-v1beta3.yaml"),
        admission_plugins=["ExtendedResourceToleration"],
    )
    assert extra_args(result.text)["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )
    assert result.state["settings"]["enable-admission-plugins"]["seeded"] == ["NodeRestriction"]


def test_kubeadm_config_v1beta4_merges_into_existing_list() -> None:
    result = apply(
        "kubeadm-config",
        fixture("edge/cluster-configuration-v1beta4-extra-args.yaml"),
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    assert extra_args(result.text) == [
        {"name": "audit-log-maxage", "value": "30"},
        {
            "name": "enable-admission-plugins",
            "value": "NodeRestriction,PodNodeSelector,ExtendedResourceToleration",
        },
        {"name": "feature-gates", "value": "HPAScaleToZero=true,InPlacePodVerticalScaling=true"},
    ]


def test_kubeadm_config_v1beta3_adds_map_entries() -> None:
    result = apply(
        "kubeadm-config",
        fixture("edge/cluster-configuration-v1beta3.yaml"),
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True},
    )
    assert extra_args(result.text) == {
        "authorization-mode": "Node,RBAC",
        "enable-admission-plugins": "NodeRestriction,ExtendedResourceToleration",
        "feature-gates": "InPlacePodVerticalScaling=true",
    }


def test_kubeadm_config_v1beta3_merges_existing_map_entries() -> None:
    result = apply(
        "kubeadm-config",
        fixture("edge/cluster-configuration-v1beta3-extra-args.yaml"),
        admission_plugins=["ExtendedResourceToleration", "PodNodeSelector"],
        feature_gates={"HPAScaleToZero": False},
    )
    assert extra_args(result.text) == {
        "authorization-mode": "Node,RBAC",
        "enable-admission-plugins": "NodeRestriction,PodNodeSelector,ExtendedResourceToleration",
        "feature-gates": "HPAScaleToZero=false",
    }
    assert result.changed_values == {
        "feature-gates:HPAScaleToZero": {"old": "true", "new": "false"}
    }


def test_kubeadm_config_creates_api_server_block_when_missing() -> None:
    original = fixture("edge/cluster-configuration-v1beta4-no-apiserver.yaml")
    result = apply("kubeadm-config", original, feature_gates={"DynamicResourceAllocation": True})
    assert result.text == original + (
        "apiServer:\n"
        "  extraArgs:\n"
        "  - name: feature-gates\n"
        "    value: DynamicResourceAllocation=true\n"
    )
    assert kfe.revert_edit("kubeadm-config", result.text, result.state).text == original


KUBEADM_FIXTURES = [
    *(f"{v}/cluster-configuration.yaml" for v in VERSIONS),
    "edge/cluster-configuration-v1beta3.yaml",
    "edge/cluster-configuration-v1beta3-extra-args.yaml",
    "edge/cluster-configuration-v1beta4-extra-args.yaml",
    "edge/cluster-configuration-v1beta4-no-apiserver.yaml",
]


@pytest.mark.parametrize("name", KUBEADM_FIXTURES)
def test_kubeadm_config_apply_is_idempotent_and_revert_byte_identical(name: str) -> None:
    original = fixture(name)
    kwargs: dict[str, Any] = {
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": {"InPlacePodVerticalScaling": True, "HPAScaleToZero": False},
    }
    first = apply("kubeadm-config", original, **kwargs)
    second = apply("kubeadm-config", first.text, state=first.state, **kwargs)
    assert first.changed and not second.changed
    assert second.text == first.text
    yaml.safe_load(first.text)
    assert kfe.revert_edit("kubeadm-config", second.text, second.state).text == original


def test_kubeadm_config_revert_keeps_an_admission_plugin_a_human_added() -> None:
    applied = apply(
        "kubeadm-config",
        fixture("v1.34/cluster-configuration.yaml"),
        admission_plugins=["ExtendedResourceToleration"],
    )
    edited = applied.text.replace(
        "NodeRestriction,ExtendedResourceToleration",
        "NodeRestriction,ExtendedResourceToleration,PodNodeSelector",
    )
    reverted = kfe.revert_edit("kubeadm-config", edited, applied.state)
    assert extra_args(reverted.text) == [
        {"name": "enable-admission-plugins", "value": "NodeRestriction,PodNodeSelector"}
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            fixture("edge/cluster-configuration-v1beta3.yaml").replace(
                "kubeadm.k8s.io/v1beta3", "kubeadm.k8s.io/v1beta4"
            ),
            "must be a list of name/value items",
        ),
        (
            fixture("edge/cluster-configuration-v1beta4-extra-args.yaml").replace(
                "kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3"
            ),
            "must be a mapping",
        ),
        (
            fixture("v1.34/cluster-configuration.yaml").replace("v1beta4", "v1beta2"),
            "unsupported apiVersion kubeadm.k8s.io/v1beta2",
        ),
        (
            fixture("edge/cluster-configuration-v1beta4-extra-args.yaml").replace(
                "  - name: audit-log-maxage\n", "  - name: feature-gates\n"
            ),
            "sets feature-gates 2 times",
        ),
        (
            fixture("v1.34/cluster-configuration.yaml").replace(
                "apiServer: {}", "apiServer: {certSANs: [a]}"
            ),
            "apiServer has an unsupported value",
        ),
        (fixture("v1.34/kubelet-config.yaml"), "not a kubeadm ClusterConfiguration"),
    ],
)
def test_kubeadm_config_refuses_what_it_cannot_parse_confidently(text: str, reason: str) -> None:
    with pytest.raises(kfe.Refusal) as excinfo:
        apply("kubeadm-config", text, feature_gates={"InPlacePodVerticalScaling": True})
    assert reason in str(excinfo.value)


# --------------------------------------------------------------------------------------------
# Command line, run as a subprocess with only the standard library importable
# --------------------------------------------------------------------------------------------


def test_cli_apply_then_revert_round_trip_in_isolated_python(host: dict[str, Path]) -> None:
    original = host["manifest"].read_bytes()
    proc = cli_apply(host, *GPU_ARGS, "--kubernetes-version", "v1.34.2")
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc)
    assert summary["file"] == str(host["manifest"])
    assert summary["changed"] is True
    assert summary["added"] == [
        "enable-admission-plugins:ExtendedResourceToleration",
        "feature-gates:InPlacePodVerticalScaling=true",
    ]
    assert summary["changed_values"] == {}
    assert summary["warnings"] == []
    command = command_of(host["manifest"].read_text(encoding="utf-8"))
    assert "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration" in command
    state = json.loads(host["state"].read_text(encoding="utf-8"))
    assert state["file"] == str(host["manifest"])

    proc = cli_revert(host)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc)["removed"] == [
        "enable-admission-plugins:ExtendedResourceToleration",
        "feature-gates:InPlacePodVerticalScaling=true",
    ]
    assert host["manifest"].read_bytes() == original
    assert not host["state"].exists()
    assert list(host["backups"].iterdir()) == []


def test_cli_second_apply_reports_unchanged_and_leaves_file_untouched(
    host: dict[str, Path],
) -> None:
    assert cli_apply(host, *GPU_ARGS).returncode == 0
    before = host["manifest"].stat()
    content = host["manifest"].read_bytes()
    proc = cli_apply(host, *GPU_ARGS)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc)["changed"] is False
    assert host["manifest"].read_bytes() == content
    assert host["manifest"].stat().st_ino == before.st_ino


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("edge/kube-apiserver-duplicate-flag.yaml", "--feature-gates appears 2 times"),
        ("edge/kube-apiserver-tabs.yaml", "tab character in indentation"),
        ("edge/kube-apiserver.json", "looks like JSON or flow-style YAML"),
        ("edge/kube-apiserver-unparseable.yaml", "unexpected top-level content"),
        ("edge/kube-apiserver-flow-command.yaml", "not a block-style list"),
    ],
)
def test_cli_refusal_names_file_and_reason_and_writes_nothing(
    host: dict[str, Path], name: str, reason: str
) -> None:
    original = fixture(name)
    host["manifest"].write_text(original, encoding="utf-8")
    proc = cli_apply(host, *GPU_ARGS)
    assert proc.returncode == 2
    message = f"refusing to edit {host['manifest']}: "
    assert message in proc.stderr
    assert reason in proc.stderr
    summary = summary_of(proc)
    assert summary["changed"] is False
    assert summary["exit_code"] == 2
    assert message in summary["error"]
    assert host["manifest"].read_text(encoding="utf-8") == original
    assert not host["state"].exists()
    assert not host["backups"].exists()


def test_cli_atomic_write_leaves_no_temp_files_and_keeps_file_mode(host: dict[str, Path]) -> None:
    os.chmod(host["manifest"], 0o600)
    proc = cli_apply(host, *GPU_ARGS)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in host["manifests"].iterdir()) == ["kube-apiserver.yaml"]
    assert stat.S_IMODE(host["manifest"].stat().st_mode) == 0o600
    assert cli_revert(host).returncode == 0
    assert sorted(p.name for p in host["manifests"].iterdir()) == ["kube-apiserver.yaml"]
    assert stat.S_IMODE(host["manifest"].stat().st_mode) == 0o600


def test_atomic_write_temp_file_is_hidden_from_the_kubelet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "kube-apiserver.yaml"
    target.write_text("old\n", encoding="utf-8")
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(kfe.os, "replace", spy)
    kfe.atomic_write(str(target), b"new\n")
    (name,) = seen
    assert name.startswith(".kube-apiserver.yaml.")
    assert not name.endswith((".yaml", ".yml", ".json"))
    assert target.read_text(encoding="utf-8") == "new\n"


def test_atomic_write_failure_keeps_original_and_removes_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "kube-apiserver.yaml"
    target.write_text("old\n", encoding="utf-8")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(kfe.os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        kfe.atomic_write(str(target), b"new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["kube-apiserver.yaml"]
    assert target.read_text(encoding="utf-8") == "old\n"


def test_cli_backup_goes_to_backup_dir_not_the_manifests_dir(host: dict[str, Path]) -> None:
    original = host["manifest"].read_bytes()
    proc = cli_apply(host, *GPU_ARGS)
    assert proc.returncode == 0, proc.stderr
    (backup,) = host["backups"].iterdir()
    assert backup.read_bytes() == original
    assert not backup.name.endswith((".yaml", ".yml", ".json"))
    assert backup.parent != host["manifests"]
    assert summary_of(proc)["backup"] == str(backup)
    # a later apply keeps the pre-stack original, not the edited file
    assert cli_apply(host, "--feature-gates", "DynamicResourceAllocation=true").returncode == 0
    assert backup.read_bytes() == original


def test_cli_revert_keeps_backup_when_the_file_was_edited_meanwhile(host: dict[str, Path]) -> None:
    assert cli_apply(host, *GPU_ARGS).returncode == 0
    text = host["manifest"].read_text(encoding="utf-8")
    host["manifest"].write_text(text.replace("--secure-port=6443", "--secure-port=6444"), "utf-8")
    proc = cli_revert(host)
    assert proc.returncode == 0, proc.stderr
    assert "the copy is kept" in summary_of(proc)["warnings"][0]
    assert len(list(host["backups"].iterdir())) == 1


@pytest.mark.parametrize("option", ["--backup-dir", "--state"])
def test_cli_refuses_backup_or_state_inside_the_manifests_dir(
    host: dict[str, Path], option: str
) -> None:
    inside = host["manifests"] if option == "--backup-dir" else host["manifests"] / "state.json"
    proc = cli_apply(host, *GPU_ARGS, option, str(inside))
    assert proc.returncode == 2
    assert "static pod manifests directory" in proc.stderr
    assert sorted(p.name for p in host["manifests"].iterdir()) == ["kube-apiserver.yaml"]


def test_cli_version_filter_warns_on_stderr(host: dict[str, Path]) -> None:
    host["manifest"].write_text(fixture("v1.35/kube-apiserver.yaml"), encoding="utf-8")
    proc = cli_apply(host, *GPU_ARGS, "--kubernetes-version", "v1.35.0")
    assert proc.returncode == 0, proc.stderr
    warning = "feature gate InPlacePodVerticalScaling is GA and locked on in v1.35; leaving it out"
    assert warning in proc.stderr
    assert summary_of(proc)["warnings"] == [warning]
    assert flag(command_of(host["manifest"].read_text(encoding="utf-8")), "feature-gates") is None


def test_cli_kubelet_config_round_trip(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    original = fixture("v1.34/kubelet-config.yaml")
    config.write_text(original, encoding="utf-8")
    common = ["--file", str(config), "--state", str(tmp_path / "s.json")]
    common += ["--backup-dir", str(tmp_path / "b")]
    proc = run_cli("kubelet-config", "apply", *common, "--feature-gates", "MemoryQoS=true")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(config.read_text(encoding="utf-8"))["featureGates"] == {"MemoryQoS": True}
    assert run_cli("kubelet-config", "revert", *common).returncode == 0
    assert config.read_text(encoding="utf-8") == original


def test_cli_kubeadm_config_out_dash_prints_document_and_summary_on_stderr(tmp_path: Path) -> None:
    source = tmp_path / "cluster-configuration.yaml"
    original = fixture("v1.34/cluster-configuration.yaml")
    source.write_text(original, encoding="utf-8")
    common = ["--file", str(source), "--state", str(tmp_path / "kubeadm.json"), "--out", "-"]
    proc = run_cli("kubeadm-config", "apply", *common, *GPU_ARGS)
    assert proc.returncode == 0, proc.stderr
    assert extra_args(proc.stdout)[0]["value"] == "NodeRestriction,ExtendedResourceToleration"
    assert json.loads(proc.stderr.strip().splitlines()[-1])["changed"] is True
    assert source.read_text(encoding="utf-8") == original  # --out leaves the input alone
    # the next run gets the edited document back (e.g. re-read from the ConfigMap)
    source.write_text(proc.stdout, encoding="utf-8")
    again = run_cli("kubeadm-config", "apply", *common, *GPU_ARGS)
    assert again.stdout == proc.stdout
    assert json.loads(again.stderr.strip().splitlines()[-1])["changed"] is False
    reverted = run_cli("kubeadm-config", "revert", *common)
    assert reverted.returncode == 0, reverted.stderr
    assert reverted.stdout == original


def test_cli_dry_run_writes_nothing_and_prints_a_diff(host: dict[str, Path]) -> None:
    original = host["manifest"].read_bytes()
    proc = cli_apply(host, *GPU_ARGS, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc)["changed"] is True
    assert "+    - --feature-gates=InPlacePodVerticalScaling=true" in proc.stderr
    assert host["manifest"].read_bytes() == original
    assert not host["state"].exists()
    assert not host["backups"].exists()


def test_cli_revert_without_state_is_a_noop(host: dict[str, Path]) -> None:
    original = host["manifest"].read_bytes()
    proc = cli_revert(host)
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc)
    assert summary["changed"] is False
    assert "nothing to revert" in summary["warnings"][0]
    assert host["manifest"].read_bytes() == original


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("--feature-gates", "InPlacePodVerticalScaling=maybe"), "is not true or false"),
        (("--feature-gates", "A=true,A=false"), "given as both true and false"),
        (("--admission-plugins", "Bad-Name"), "not a plugin name"),
        (("--kubernetes-version", "latest"), "not a Kubernetes version"),
    ],
)
def test_cli_rejects_bad_arguments_with_exit_2(
    host: dict[str, Path], args: tuple[str, ...], reason: str
) -> None:
    proc = cli_apply(host, *args)
    assert proc.returncode == 2
    assert reason in proc.stderr
    assert not host["state"].exists()


def test_cli_kubelet_config_rejects_admission_plugins(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(fixture("v1.34/kubelet-config.yaml"), encoding="utf-8")
    proc = run_cli(
        "kubelet-config", "apply", "--file", str(config), "--state", str(tmp_path / "s.json"),
        "--admission-plugins", "ExtendedResourceToleration",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "kubelet-config takes no --admission-plugins" in proc.stderr


def test_cli_refuses_a_state_file_recorded_for_another_file(host: dict[str, Path]) -> None:
    assert cli_apply(host, *GPU_ARGS).returncode == 0
    other = host["manifests"].parent / "kube-apiserver-copy.yaml"
    other.write_text(fixture("v1.34/kube-apiserver.yaml"), encoding="utf-8")
    proc = run_cli(
        "apiserver-manifest", "apply", "--file", str(other), "--state", str(host["state"]),
        "--backup-dir", str(host["backups"]), *GPU_ARGS,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"records edits of {host['manifest']}" in proc.stderr


def test_cli_missing_file_is_a_plain_error_exit_1(tmp_path: Path) -> None:
    proc = run_cli(
        "apiserver-manifest", "apply", "--file", str(tmp_path / "nope.yaml"),
        "--state", str(tmp_path / "state" / "s.json"), *GPU_ARGS,
    )  # fmt: skip
    assert proc.returncode == 1
    assert summary_of(proc)["exit_code"] == 1


def test_build_argv_produces_a_command_line_the_program_accepts(host: dict[str, Path]) -> None:
    argv = kfe.build_argv(
        "apiserver-manifest",
        "apply",
        file=str(host["manifest"]),
        state=str(host["state"]),
        admission_plugins=["ExtendedResourceToleration"],
        feature_gates={"InPlacePodVerticalScaling": True, "HPAScaleToZero": False},
        kubernetes_version="v1.34.2",
        backup_dir=str(host["backups"]),
    )
    assert (
        argv[argv.index("--feature-gates") + 1]
        == "InPlacePodVerticalScaling=true,HPAScaleToZero=false"
    )
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert flag(command_of(host["manifest"].read_text(encoding="utf-8")), "feature-gates") == (
        "InPlacePodVerticalScaling=true,HPAScaleToZero=false"
    )
