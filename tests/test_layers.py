"""The table of layers (stack_config.LAYERS) and the house it describes: a layer is a folder
of the same modules, found from its row, and everything that lists layers derives from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pulumi
import pytest

import components
from components.settings import PROJECT, Layer
from stack_config import LAYERS, LayerRow, StackConfig
from tools.config_docs import README_FILE, layer_table, readme_text

ROOT = Path(__file__).resolve().parent.parent


def folder_of(component: str) -> Path:
    """components/<snake_case of the component>/."""
    return ROOT / "components" / re.sub(r"(?<!^)(?=[A-Z])", "_", component).lower()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_layers_are_the_stack_config_sections_marked_as_layers() -> None:
    marked = [
        n
        for n, i in StackConfig.model_fields.items()
        if any(isinstance(m, Layer) for m in i.metadata)
    ]
    assert [layer.field for layer in LAYERS] == marked
    assert len({layer.component for layer in LAYERS}) == len(LAYERS)
    for layer in LAYERS:
        assert StackConfig.model_fields[layer.field].alias == layer.key


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.component)
def test_layers_each_row_names_a_component_in_its_own_folder(layer: LayerRow) -> None:
    component = getattr(components, layer.component)
    assert issubclass(component, pulumi.ComponentResource)
    folder = folder_of(layer.component)
    assert component.__module__ == f"components.{folder.name}.component"
    assert getattr(components, f"{layer.component}Args")
    for module in ("__init__.py", "settings.py", "component.py"):
        assert (folder / module).is_file(), f"{folder.name}/{module} is missing"
    assert f'"{PROJECT}:index:{layer.component}"' in (folder / "component.py").read_text() or (
        f'f"{{PROJECT}}:index:{layer.component}"' in (folder / "component.py").read_text()
    )


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.component)
def test_layers_settings_never_import_their_component(layer: LayerRow) -> None:
    folder = folder_of(layer.component)
    own = f"components.{folder.name}"
    imported = _imports(folder / "settings.py")
    assert not {m for m in imported if m.startswith((f"{own}.component", f"{own}.provider"))}


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.component)
def test_layers_a_namespace_field_is_a_setting_with_its_create_switch(layer: LayerRow) -> None:
    if layer.namespace is None:
        return
    fields = layer.settings.model_fields
    assert layer.namespace in fields
    assert "create_namespace" in fields


def test_layers_readme_table_is_the_generated_one_on_a_page_of_at_most_16_kib() -> None:
    assert len(README_FILE.read_bytes()) <= 16 * 1024
    current = README_FILE.read_text()
    assert current == readme_text(current), "run: python -m tools.config_docs"
    assert layer_table().count("\n") == len(LAYERS) + 2


def _shared_modules() -> set[str]:
    """The shared modules: components/*.py and components/providers/, which any layer may use."""
    root = ROOT / "components"
    modules = {f"components.{p.stem}" for p in root.glob("*.py") if p.stem != "__init__"}
    return modules | {"components.providers"}


def _components_imported(path: Path) -> set[str]:
    """The components.* modules `path` imports, as packages or modules (a name imported from a
    module is left out; a name imported from the components package is its module, or a name
    of its __init__, which imports every layer)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "components" and node.level == 0:
            found.update(f"components.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "components" or m.startswith("components.")}


@pytest.mark.parametrize("layer", LAYERS, ids=lambda row: row.component)
def test_layers_a_layer_imports_only_the_shared_modules_and_itself(layer: LayerRow) -> None:
    """Layers meet only in __main__.py, through what they hand each other
    (components/handoffs.py): a layer folder never imports another layer."""
    folder = folder_of(layer.component)
    own = f"components.{folder.name}"
    shared = _shared_modules()
    crossing = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in folder.rglob("*.py")
        for module in _components_imported(path)
        if not (module == own or module.startswith(f"{own}."))
        and not any(module == s or module.startswith(f"{s}.") for s in shared)
    )
    assert crossing == []


def test_layers_the_shared_modules_import_no_layer() -> None:
    layers = {f"components.{folder_of(layer.component).name}" for layer in LAYERS}
    crossing = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "components").glob("*.py")
        if path.stem != "__init__"
        for module in _components_imported(path)
        if any(module == layer or module.startswith(f"{layer}.") for layer in layers)
    )
    assert crossing == []


@pytest.mark.parametrize("layer", LAYERS, ids=lambda row: row.component)
def test_layers_a_helm_layer_names_its_chart_and_the_local_cluster_stands_it_in(
    layer: LayerRow,
) -> None:
    """A layer that installs a Helm release names its chart in its row (Layer.chart), from
    which the harness writes the local stand-in chart; the CRDs that chart carries are a file
    the tools build renders."""
    from tools.harness.charts import CHARTS

    source = (folder_of(layer.component) / "component.py").read_text()
    if "helm.v3.Release(" not in source:
        assert layer.chart is None
        return
    assert layer.chart is not None, f"{layer.component} installs a chart its row does not name"
    assert CHARTS[layer.chart.name] == (layer.key, layer.chart)
    if layer.chart.crds is not None:
        assert layer.chart.crds in (ROOT / "tools" / "build-tools.sh").read_text()
