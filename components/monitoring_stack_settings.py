"""MonitoringStack's settings: the stack config's monitoring section, its rules and defaults."""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import Field, ValidationInfo, model_validator

from components.charts import HELM_REPOSITORY, chart_version, free_values
from components.kubernetes_names import NAMESPACE, is_dns1123_subdomain
from components.settings import BOOL, PROJECT, Settings, context_value, problem, text

DEFAULT_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
DEFAULT_VERSION = "88.2.0"

SECRET_NAME = text(is_dns1123_subdomain, "expected a Secret name (DNS-1123 subdomain)")


_PROMETHEUS_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+", re.ASCII)


def is_prometheus_duration(value: str) -> bool:
    return _PROMETHEUS_DURATION.fullmatch(value) is not None


PROMETHEUS_DURATION = text(is_prometheus_duration, "expected a Prometheus duration, e.g. 15s or 1m")


class MonitoringStackSettings(Settings):
    """kube-prometheus-stack, DCGM scraping, the GPU dashboard and alerts (the stack config's
    monitoring). Grafana's admin password is the top-level secret key grafanaAdminPassword."""

    enabled: Annotated[bool, BOOL] = False
    """Build the MonitoringStack layer (needs a reachable chart repository)."""
    namespace: Annotated[str, NAMESPACE] = "monitoring"
    """The stack's namespace (created here, so no other layer's)."""
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
    """Free-form chart values, deep-merged last."""

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
        if password_set and self.grafana_admin_secret:
            raise problem(
                "set either grafanaAdminPassword or monitoring.grafanaAdminSecret, not both",
                at=".grafanaAdminSecret",
                value=self.grafana_admin_secret,
            )
        return self
