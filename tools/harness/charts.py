"""Local Helm charts for the stack's releases: no chart repository can be reached here.

Each chart carries the name and version the stack pins (GpuOperator's and MonitoringStack's
defaults) and renders the values its release was given into a ConfigMap
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

from components.gpu_operator import settings as gpu_operator_settings
from components.monitoring_stack import settings as monitoring_stack_settings
from tools.harness.tools import require_tool

MONITORING_CRDS = "monitoring-crds.yaml"
"""The built file of monitoring.coreos.com CRDs (tools/build-tools.sh)."""

GPU_OPERATOR = "gpu-operator"
KUBE_PROMETHEUS_STACK = "kube-prometheus-stack"
# Chart -> the stack's config section that names where it comes from, and its pinned version.
CHARTS = {
    GPU_OPERATOR: ("gpuOperator", gpu_operator_settings.DEFAULT_VERSION),
    KUBE_PROMETHEUS_STACK: ("monitoring", monitoring_stack_settings.DEFAULT_VERSION),
}
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
    if chart == KUBE_PROMETHEUS_STACK:
        (directory / "crds").mkdir(exist_ok=True)
        (directory / "crds" / MONITORING_CRDS).write_text(require_tool(MONITORING_CRDS).read_text())
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
        version = (versions or {}).get(chart) or section.get("version") or pinned
        section["repository"] = str(write_chart(root, chart, version))
        overrides[key] = section
    return overrides


def release_values(core: Any, namespace: str, release: str) -> dict[str, Any]:
    """The values `release` was installed or upgraded with, as its chart rendered them."""
    config_map = core.read_namespaced_config_map(f"{release}-values", namespace)
    values: dict[str, Any] = yaml.safe_load(config_map.data[VALUES_KEY]) or {}
    return values
