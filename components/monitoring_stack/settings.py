"""MonitoringStack's settings: the stack config's monitoring section, its rules and defaults."""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import Field, ValidationInfo, model_validator

from components.charts import HELM_REPOSITORY, HelmChart, chart_version, free_values
from components.kubernetes_names import NAMESPACE, is_dns1123_subdomain
from components.settings import BOOL, PROJECT, Settings, context_value, problem, text

DEFAULT_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
DEFAULT_VERSION = "88.2.0"
# The chart this layer installs (its row in the table of layers names it), with the
# monitoring.coreos.com CRDs it carries (rendered by the tools build from the Prometheus
# Operator's API module: the local stand-in chart carries them too).
CHART = HelmChart("kube-prometheus-stack", DEFAULT_VERSION, crds="monitoring-crds.yaml")

SECRET_NAME = text(is_dns1123_subdomain, "expected a Secret name (DNS-1123 subdomain)")


_PROMETHEUS_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+", re.ASCII)


def is_prometheus_duration(value: str) -> bool:
    return _PROMETHEUS_DURATION.fullmatch(value) is not None


PROMETHEUS_DURATION = text(is_prometheus_duration, "expected a Prometheus duration, e.g. 15s or 1m")

# kube-state-metrics' chart values and its list of Kubernetes labels exported as Prometheus
# labels (kube_<resource>_labels), e.g. ["nodes=[topology.kubernetes.io/zone]", "pods=[app]"]:
# the chart joins the entries with commas into --metric-labels-allowlist.
# Ref: https://github.com/prometheus-community/helm-charts/blob/main/charts/kube-state-metrics/templates/deployment.yaml
KUBE_STATE_METRICS = "kube-state-metrics"
LABELS_ALLOWLIST = "metricLabelsAllowlist"
LABELS_ALLOWLIST_FORMAT = (
    "expected a list of <resource>=[<label>,...] entries (kube-state-metrics' "
    "--metric-labels-allowlist), e.g. nodes=[topology.kubernetes.io/zone]"
)
_ALLOWLIST_GROUP = re.compile(r"\s*([^\s=\[\],][^=\[\],]*?)\s*=\[([^=\[\]]*)\]\s*")


def parse_labels_allowlist(entries: list[str]) -> dict[str, list[str]]:
    """kube-state-metrics' reading of a metricLabelsAllowlist: resource -> label keys.

    As its flag parser does, a resource named twice keeps its last group. Raises ValueError
    on text not of the form <resource>=[<label>,...],<resource>=[...].
    # Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/pkg/options/types.go (LabelsAllowList.Set)
    """
    flag = ",".join(entries)
    groups: dict[str, list[str]] = {}
    position = 0
    while position < len(flag):
        group = _ALLOWLIST_GROUP.match(flag, position)
        if group is None:
            raise ValueError(f"not <resource>=[<label>,...] at {flag[position:]!r}")
        labels = [label.strip() for label in group[2].split(",")] if group[2].strip() else []
        if "" in labels:
            raise ValueError(f"an empty label in {group[0].strip()!r}")
        groups[group[1]] = labels
        position = group.end()
        if position < len(flag):
            if flag[position] != "," or position + 1 == len(flag):
                raise ValueError(f"expected ',' and another group at {flag[position:]!r}")
            position += 1
    return groups


class MonitoringStackSettings(Settings):
    """kube-prometheus-stack, DCGM scraping, the GPU dashboard and alerts (the stack config's
    monitoring). Grafana's admin password is the top-level secret key grafanaAdminPassword."""

    enabled: Annotated[bool, BOOL] = False
    """Build the MonitoringStack layer (needs a reachable chart repository)."""
    namespace: Annotated[str, NAMESPACE] = "monitoring"
    """The monitoring namespace. Created (and deleted on destroy) by this layer, so it must not
    exist before the first `up`, unless createNamespace is false."""
    create_namespace: Annotated[bool, BOOL] = True
    """Create `namespace` (true), or use an existing one without owning it (false: it must
    exist, and `destroy` leaves it). False with grafanaAdminSecret, whose Secret lives there."""
    repository: Annotated[str, HELM_REPOSITORY] = DEFAULT_REPOSITORY
    """Where kube-prometheus-stack comes from: a chart repository URL, an OCI registry
    (oci://host/path) or a local chart archive or directory (air-gapped installs)."""
    version: Annotated[str, chart_version(DEFAULT_VERSION)] = DEFAULT_VERSION
    """Chart version (pinned)."""
    upgrade_crds: Annotated[bool, BOOL] = Field(default=True, alias="upgradeCRDs")
    """Apply the chart's CRDs (server-side) from its pre-install/pre-upgrade hook, before the
    release's own objects: Helm never upgrades a chart's CRDs by itself."""
    grafana_admin_secret: Annotated[str, SECRET_NAME] | None = None
    """Name of an existing Secret in `namespace` (keys admin-user, admin-password), instead of
    grafanaAdminPassword."""
    dcgm_scrape_interval: Annotated[str, PROMETHEUS_DURATION] = "15s"
    """How often dcgm-exporter is scraped."""
    values: Annotated[dict[str, Any], free_values()] = Field(default_factory=dict)
    """Free-form chart values, deep-merged last; a kube-state-metrics.metricLabelsAllowlist is
    merged with the node label the GPU alerts read (nvidia.com/gpu.deploy.operands)."""

    @model_validator(mode="after")
    def _one_grafana_password_source(self, info: ValidationInfo) -> Self:
        password_set = context_value(info, "grafana_password_set")
        if password_set is None:  # validated on its own: the Args check the pair
            return self
        if self.enabled and not password_set and not self.grafana_admin_secret:
            raise problem(
                "required when monitoring.enabled is true (pulumi config set --secret "
                f"{PROJECT}:grafanaAdminPassword), unless monitoring.grafanaAdminSecret names "
                "an existing Secret",
                key="grafanaAdminPassword",
                value="",
            )
        if self.grafana_admin_secret and self.create_namespace:
            raise problem(
                "needs monitoring.createNamespace: false: the Secret is created before `up`, "
                "so its namespace exists already and is not this stack's to create or delete",
                at=".grafanaAdminSecret",
                value=self.grafana_admin_secret,
            )
        if password_set and self.grafana_admin_secret:
            raise problem(
                "set either grafanaAdminPassword or monitoring.grafanaAdminSecret, not both",
                at=".grafanaAdminSecret",
                value=self.grafana_admin_secret,
            )
        return self

    @model_validator(mode="after")
    def _labels_allowlist_parses(self) -> Self:
        """The stack adds the GPU alerts' node label to kube-state-metrics' allowlist, so the
        one in `values` must be what kube-state-metrics can read."""
        chart = self.values.get(KUBE_STATE_METRICS)
        if chart is None:
            return self
        at = f".values.{KUBE_STATE_METRICS}"
        if not isinstance(chart, dict):
            raise problem("expected an object of chart values", at=at, value=chart)
        entries = chart.get(LABELS_ALLOWLIST)
        if entries is None:
            return self
        try:
            if not (isinstance(entries, list) and all(isinstance(e, str) for e in entries)):
                raise ValueError(entries)
            parse_labels_allowlist(entries)
        except ValueError:
            raise problem(
                LABELS_ALLOWLIST_FORMAT, at=f"{at}.{LABELS_ALLOWLIST}", value=entries
            ) from None
        return self
