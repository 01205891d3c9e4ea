"""Local Helm charts for the stack's releases: no chart repository can be reached here.

Each chart carries the name and version the stack pins (the HelmChart of each layer's row in
stack_config.LAYERS) and renders the values its release was given into a ConfigMap
(`<release>-values`, key `values.yaml`), so a scenario reads back exactly what the real
kubernetes provider handed to Helm. kube-prometheus-stack's chart carries the
monitoring.coreos.com CRDs in crds/ (rendered by the build from the Prometheus Operator's API
module: monitoring-crds.yaml), which Helm installs before the release and leaves on uninstall,
as it does with the real chart; the stack's PrometheusRule and ServiceMonitors need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.charts import HelmChart
from components.gpu_operator.settings import CHART as GPU_OPERATOR_CHART
from components.monitoring_stack.settings import CHART as MONITORING_CHART
from stack_config import LAYERS
from tools.harness.tools import require_tool

# Chart name -> (the stack config section that names where it comes from, the chart): every
# layer whose row names a chart (stack_config.LAYERS).
CHARTS: dict[str, tuple[str, HelmChart]] = {
    row.chart.name: (row.key, row.chart) for row in LAYERS if row.chart is not None
}
GPU_OPERATOR = GPU_OPERATOR_CHART.name
KUBE_PROMETHEUS_STACK = MONITORING_CHART.name
# The built files of the CRDs the charts carry (tools/build-tools.sh builds them).
CHART_CRDS = tuple(sorted({c.crds for _, c in CHARTS.values() if c.crds is not None}))
VALUES_KEY = "values.yaml"

VALUES_TEMPLATE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-values
  namespace: {{ .Release.Namespace }}
  labels:
    helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
data:
  values.yaml: |
{{ toYaml .Values | indent 4 }}
"""


def write_chart(root: Path, chart: str, version: str) -> Path:
    """A chart directory for `chart` at `version` under `root`; its path."""
    directory = root / f"{chart}-{version}"
    (directory / "templates").mkdir(parents=True, exist_ok=True)
    (directory / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": chart,
                "version": version,
                "description": f"Local stand-in for the {chart} chart: renders its values.",
            }
        )
    )
    (directory / "templates" / "values.yaml").write_text(VALUES_TEMPLATE)
    crds = CHARTS[chart][1].crds
    if crds is not None:
        (directory / "crds").mkdir(exist_ok=True)
        (directory / "crds" / crds).write_text(require_tool(crds).read_text())
    return directory


def chart_overrides(
    root: Path, config: dict[str, Any], versions: dict[str, str] | None = None
) -> dict[str, Any]:
    """Config overrides that point each enabled release of `config` at a local chart.

    `versions` names a chart version other than the pinned one (an upgrade); otherwise the
    section's own `version`, if the stack sets one, or the pinned one.
    """
    overrides = {}
    for chart, (key, pinned) in CHARTS.items():
        section = dict(config.get(key) or {})
        if not section.get("enabled"):
            continue
        version = (versions or {}).get(chart) or section.get("version") or pinned.version
        section["repository"] = str(write_chart(root, chart, version))
        overrides[key] = section
    return overrides


def release_values(core: Any, namespace: str, release: str) -> dict[str, Any]:
    """The values `release` was installed or upgraded with, as its chart rendered them."""
    config_map = core.read_namespaced_config_map(f"{release}-values", namespace)
    values: dict[str, Any] = yaml.safe_load(config_map.data[VALUES_KEY]) or {}
    return values
