"""MonitoringStack: kube-prometheus-stack, the DCGM ServiceMonitor, a GPU dashboard and alerts.

- kube-prometheus-stack as a `helm.v3.Release` (pinned). Its Prometheus selects every
  ServiceMonitor, PodMonitor and PrometheusRule in the cluster
  (`*SelectorNilUsesHelmValues: false`), so nothing here needs the release label.
- Grafana's admin password comes from a Pulumi secret, stored in a Kubernetes Secret the chart
  reads (`grafana.admin.existingSecret`), or from a Secret that already exists; never the chart
  default. Grafana's sidecar loads dashboards from ConfigMaps labelled grafana_dashboard=1.
- The GPU dashboard (components/dashboards/gpu.json): utilisation (DCGM_FI_DEV_GPU_UTIL, or
  DCGM_FI_PROF_GR_ENGINE_ACTIVE on MIG GPUs, which have no GPU_UTIL) and framebuffer memory
  (MiB) per node and per workload pod, allocated vs allocatable and free GPUs per node and GPU
  resource, temperature, power and XID codes. The PrometheusRule gpu-alerts
  (components/alerts/gpu.rules.yaml): a new XID code (hardware, or raised by the application),
  GPU above 85 C for 5 minutes, a GPU pod unschedulable for 10 minutes, a GPU node with nothing
  allocatable for 5 minutes (device plugin down, GPUs unhealthy), and, when the stack scrapes
  dcgm-exporter, GPU nodes without its metrics and no dcgm-exporter target at all.
  Both select GPU resources by a regex built from the GPU Operator's settings (gpu_resources,
  GpuOperatorSettings.gpu_resources(), as the gate and the scheduler get them), in
  kube-state-metrics' names; the tests parse every PromQL expression with Prometheus' parser
  and run promtool on the rules and on the panels.
- Exactly one ServiceMonitor scrapes dcgm-exporter, and it is this one, not the GPU Operator
  chart's (forced off there; config turning it on while monitoring is enabled is rejected): its
  CRD arrives with this release, so it is created after the release. honorLabels stays false so
  the workload labels dcgm-exporter puts on a GPU's series land in exported_namespace/
  exported_pod/exported_container, apart from the exporter pod's own; `node` comes from the
  pod's node name, the misleading Hostname label is dropped and the job is fixed (dcgm_endpoint).
  Its target namespace comes from the operator's release status.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Self

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pydantic import Field, ValidationInfo, model_validator

from components.cluster_access import ClusterAccess
from components.gpu_operator import WHOLE_GPU, DcgmTarget, GpuResources, deep_merge
from components.settings import (
    BOOL,
    HELM_REPOSITORY,
    NAMESPACE,
    PROMETHEUS_DURATION,
    Runtime,
    Settings,
    chart_version,
    context_value,
    free_values,
    helm_chart,
    is_dns1123_subdomain,
    problem,
    text,
)

TOKEN = "gpu-cluster:index:MonitoringStack"

DEFAULT_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
DEFAULT_VERSION = "88.2.0"
RELEASE_NAME = "kube-prometheus-stack"
HERE = Path(__file__).resolve().parent
DASHBOARD_FILE = HERE / "dashboards" / "gpu.json"
RULES_FILE = HERE / "alerts" / "gpu.rules.yaml"
GATE_RULES_FILE = HERE / "alerts" / "gate.rules.yaml"
# The expiry of OPA's serving certificate, published by the stack (gate_rule_groups).
CERT_NOT_AFTER_METRIC = "gpu_cluster:opa_serving_cert_not_after:timestamp_seconds"
DASHBOARD_LABEL = "grafana_dashboard"
GRAFANA_USER_KEY = "admin-user"
GRAFANA_PASSWORD_KEY = "admin-password"
# The job label of dcgm-exporter's series (set by dcgm_endpoint): the absence alerts select it.
DCGM_JOB = "dcgm-exporter"
# Placeholders in gpu.rules.yaml, filled in by rule_groups(): PromQL has no variables.
GPU_RESOURCES_PLACEHOLDER = "$gpu_resources"
DCGM_JOB_PLACEHOLDER = "$dcgm_job"
_PLACEHOLDER = re.compile(r"\$[A-Za-z_]")
# The rule group on missing dcgm-exporter data: deployed only when the stack scrapes it.
DCGM_ABSENCE_GROUP = "gpu-cluster.gpu.absent"
# The dashboard's constant variable holding the same regex (panels use $gpu_resources).
DASHBOARD_RESOURCES_VARIABLE = "gpu_resources"
# kube-state-metrics turns a resource name into a label value by replacing every character
# outside [a-zA-Z0-9_] with `_`: nvidia.com/mig-1g.10gb -> nvidia_com_mig_1g_10gb.
# Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/internal/store/utils.go (sanitizeLabelName)
_KSM_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def kube_state_metrics_resource(name: str) -> str:
    """A Kubernetes resource name as kube-state-metrics exports it in its `resource` label."""
    return _KSM_INVALID.sub("_", name)


def gpu_resource_regex(resources: GpuResources) -> str:
    """The regex (Prometheus: anchored RE2) matching the `resource` label of every GPU
    resource: each exact name, and each prefix (MIG profiles) followed by anything.

    Sanitised names hold only [a-zA-Z0-9_], so nothing needs escaping.
    """
    names = [kube_state_metrics_resource(n) for n in resources.names]
    names += [kube_state_metrics_resource(p) + ".+" for p in resources.prefixes]
    return "|".join(dict.fromkeys(names))


def load_dashboard(path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    """The GPU dashboard (Grafana JSON model) as written, with its default resource regex."""
    return dict(json.loads(path.read_text()))


def gpu_dashboard(resources: GpuResources, path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    """The GPU dashboard as deployed: its hidden constant variable `gpu_resources` holds the
    regex of `resources`, which the panels and the node variable select with."""
    dashboard = load_dashboard(path)
    (variable,) = [
        v for v in dashboard["templating"]["list"] if v["name"] == DASHBOARD_RESOURCES_VARIABLE
    ]
    variable["query"] = gpu_resource_regex(resources)
    return dashboard


def load_rule_groups(path: Path = RULES_FILE) -> list[dict[str, Any]]:
    """The alert rule groups, in Prometheus rule-file form (also a PrometheusRule's spec)."""
    return list(yaml.safe_load(path.read_text())["groups"])


def rule_groups(
    resources: GpuResources, *, dcgm_scraped: bool = True, path: Path = RULES_FILE
) -> list[dict[str, Any]]:
    """gpu.rules.yaml as deployed: $gpu_resources and $dcgm_job filled in, and the group on
    missing dcgm-exporter data left out when nothing scrapes dcgm-exporter (it would fire for
    good)."""
    values = {
        GPU_RESOURCES_PLACEHOLDER: gpu_resource_regex(resources),
        DCGM_JOB_PLACEHOLDER: DCGM_JOB,
    }
    groups = []
    for group in load_rule_groups(path):
        if group["name"] == DCGM_ABSENCE_GROUP and not dcgm_scraped:
            continue
        for rule in group["rules"]:
            expr = str(rule["expr"])
            for placeholder, value in values.items():
                expr = expr.replace(placeholder, value)
            if _PLACEHOLDER.search(expr):
                raise ValueError(f"{path.name}: unknown placeholder left in {expr!r}")
            rule["expr"] = expr
        groups.append(group)
    return groups


def gate_rule_groups(not_after: str) -> list[dict[str, Any]]:
    """gate.rules.yaml's alerts, after a recording rule that publishes `not_after`.

    `not_after` is OpaGate's serving_cert_not_after (RFC 3339); the recording rule turns it
    into CERT_NOT_AFTER_METRIC (Unix seconds), which the alerts compare with time(). A renewed
    certificate changes the rule on the same `pulumi up`.
    """
    epoch = int(datetime.fromisoformat(not_after.replace("Z", "+00:00")).timestamp())
    published = {
        "name": "gpu-cluster.gate.published",
        "rules": [
            {
                "record": CERT_NOT_AFTER_METRIC,
                "expr": f"vector({epoch})",
                "labels": {"certificate": "opa-serving"},
            }
        ],
    }
    return [published, *load_rule_groups(GATE_RULES_FILE)]


def dcgm_endpoint(port: str, interval: str) -> dict[str, Any]:
    """The scrape endpoint for dcgm-exporter.

    dcgm-exporter puts namespace/pod/container on a GPU's series when a pod uses the GPU (the
    kubelet's pod-resources API) and nothing on an idle GPU's. With honorLabels true Prometheus
    filled the missing ones in from the target, so idle GPUs showed up as the exporter's own
    pod; with honorLabels false (here) every series carries the exporter pod's labels and the
    workload's are renamed exported_namespace/exported_pod/exported_container, which only
    GPUs in use have. The dashboard and the alerts read the workload from exported_*.
    dcgm-exporter's Hostname label is the exporter pod's name, not the node's, so it is dropped
    and `node` comes from the pod's node name. The job is DCGM_JOB rather than the Service's
    name, for the alerts on its absence.
    # Ref: https://github.com/prometheus/prometheus/blob/v3.15.0/scrape/scrape.go (mutateSampleLabels)
    # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/kube-prometheus.html
    """
    return {
        "port": port,
        "path": "/metrics",
        "interval": interval,
        "honorLabels": False,
        "relabelings": [
            {
                "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node",
                "action": "replace",
            },
            {"targetLabel": "job", "replacement": DCGM_JOB, "action": "replace"},
        ],
        "metricRelabelings": [{"action": "labeldrop", "regex": "Hostname"}],
    }


SECRET_NAME = text(is_dns1123_subdomain, "expected a Secret name (DNS-1123 subdomain)")


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
                "gpu-cluster:grafanaAdminPassword), unless monitoring.grafanaAdminSecret names "
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


class MonitoringStackArgs(MonitoringStackSettings):
    """Inputs of MonitoringStack: its settings, the Grafana password and dcgm-exporter's place.
    Exactly one of the two Grafana password sources is set."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""
    grafana_admin_password: Annotated[pulumi.Output[str] | str | None, Runtime()] = None
    """Grafana admin password (a Pulumi secret); stored in a Secret the chart reads."""
    dcgm: Annotated[DcgmTarget | None, Runtime()] = None
    """dcgm-exporter to scrape (GpuOperator.dcgm_target); None: no GPU metrics to scrape (and
    no alerts on their absence)."""
    gpu_resources: Annotated[GpuResources, Runtime()] = Field(
        default_factory=lambda: GpuResources(names=(WHOLE_GPU,), prefixes=())
    )
    """The GPU resources pods ask for (GpuOperatorSettings.gpu_resources()): what the alerts
    and the dashboard count as GPUs. Default: nvidia.com/gpu only."""
    opa_serving_cert_not_after: Annotated[pulumi.Output[str] | str | None, Runtime()] = None
    """When OPA's serving certificate expires (OpaGate.serving_cert_not_after, engine opa);
    None: no gate alerts."""

    @model_validator(mode="after")
    def _exactly_one_password_source(self) -> Self:
        if (self.grafana_admin_password is None) == (self.grafana_admin_secret is None):
            raise ValueError(
                "MonitoringStackArgs: set exactly one of grafana_admin_password (a Pulumi "
                "secret) or grafana_admin_secret (an existing Secret's name)"
            )
        return self


def stack_values(args: MonitoringStackArgs, grafana_secret: str) -> dict[str, Any]:
    """The chart values: CRD upgrades, selectors, Grafana admin Secret and sidecar, then
    `args.values`."""
    typed: dict[str, Any] = {
        # The chart's CRD hook Job (pre-install, pre-upgrade, pre-rollback) runs
        # `kubectl apply --server-side` on the new version's CRDs before Helm touches the
        # release's objects, which are validated against them.
        "crds": {"enabled": True, "upgradeJob": {"enabled": args.upgrade_crds}},
        "prometheus": {
            "prometheusSpec": {
                # Select every monitor and rule in the cluster, not only the release's own.
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
            }
        },
        "grafana": {
            "admin": {
                "existingSecret": grafana_secret,
                "userKey": GRAFANA_USER_KEY,
                "passwordKey": GRAFANA_PASSWORD_KEY,
            },
            "sidecar": {
                "dashboards": {"enabled": True, "label": DASHBOARD_LABEL, "labelValue": "1"}
            },
        },
    }
    return deep_merge(typed, args.values)


class MonitoringStack(pulumi.ComponentResource):
    """Prometheus, Grafana, the DCGM ServiceMonitor, the GPU dashboard and GPU alerts."""

    namespace: pulumi.Output[str]
    """The stack's namespace."""
    release_status: pulumi.Output[str]
    """Helm release status of kube-prometheus-stack."""
    chart_version: pulumi.Output[str]
    """Deployed chart version."""
    grafana_service: pulumi.Output[str]
    """`<namespace>/<service>` of Grafana (port 80), e.g. for kubectl port-forward."""
    dashboard_name: pulumi.Output[str]
    """Name of the ConfigMap holding the GPU dashboard."""
    dashboard_uid: pulumi.Output[str]
    """The GPU dashboard's Grafana uid (its URL is /d/<uid>)."""
    rule_name: pulumi.Output[str]
    """Name of the PrometheusRule with the GPU alerts."""
    dcgm_service_monitor: pulumi.Output[str]
    """Name of the ServiceMonitor scraping dcgm-exporter ("" when there is none)."""

    def __init__(
        self, name: str, args: MonitoringStackArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)
        labels = {"app.kubernetes.io/part-of": "gpu-cluster"}

        # An existing admin Secret lives in a namespace the user created beforehand, so the
        # namespace is the user's: the stack creates (and deletes) it only when it also
        # creates the Secret.
        namespace_name: pulumi.Output[str] = pulumi.Output.from_input(args.namespace)
        if args.grafana_admin_secret is None:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace", metadata={"name": args.namespace, "labels": labels}, opts=child
            )
            namespace_name = namespace.metadata.apply(lambda m: str(m["name"]))

        if args.grafana_admin_password is not None:
            admin = k8s.core.v1.Secret(
                f"{name}-grafana-admin",
                metadata={"name": "grafana-admin", "namespace": namespace_name, "labels": labels},
                type="Opaque",
                string_data={
                    GRAFANA_USER_KEY: "admin",
                    GRAFANA_PASSWORD_KEY: pulumi.Output.secret(args.grafana_admin_password),
                },
                opts=child,
            )
            grafana_secret = admin.metadata.apply(lambda m: str(m["name"]))
        else:
            grafana_secret = pulumi.Output.from_input(str(args.grafana_admin_secret))

        release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            **helm_chart("kube-prometheus-stack", args.repository, args.version),
            namespace=namespace_name,
            values=grafana_secret.apply(lambda secret: stack_values(args, secret)),
            opts=child,
        )
        # The CRDs (ServiceMonitor, PrometheusRule) arrive with the release.
        after_release = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[release])
        )

        dashboard = gpu_dashboard(args.gpu_resources)
        dashboard_map = k8s.core.v1.ConfigMap(
            f"{name}-gpu-dashboard",
            metadata={
                "name": "gpu-dashboard",
                "namespace": namespace_name,
                "labels": {**labels, DASHBOARD_LABEL: "1"},
            },
            data={"gpu.json": json.dumps(dashboard, indent=2, sort_keys=True)},
            opts=child,
        )

        rule = k8s.apiextensions.CustomResource(
            f"{name}-gpu-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={"name": "gpu-alerts", "namespace": namespace_name, "labels": labels},
            spec={"groups": rule_groups(args.gpu_resources, dcgm_scraped=args.dcgm is not None)},
            opts=after_release,
        )

        if args.opa_serving_cert_not_after is not None:
            # Alerts before the admission webhook's serving certificate expires.
            k8s.apiextensions.CustomResource(
                f"{name}-gate-alerts",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={"name": "gpu-gate-alerts", "namespace": namespace_name, "labels": labels},
                spec=pulumi.Output.from_input(args.opa_serving_cert_not_after).apply(
                    lambda not_after: {"groups": gate_rule_groups(not_after)}
                ),
                opts=after_release,
            )

        monitor_name: pulumi.Output[str] = pulumi.Output.from_input("")
        if args.dcgm is not None:
            dcgm = args.dcgm
            monitor = k8s.apiextensions.CustomResource(
                f"{name}-dcgm-exporter",
                api_version="monitoring.coreos.com/v1",
                kind="ServiceMonitor",
                metadata={"name": "dcgm-exporter", "namespace": namespace_name, "labels": labels},
                spec={
                    "selector": {"matchLabels": dict(dcgm.selector)},
                    "namespaceSelector": {"matchNames": [pulumi.Output.from_input(dcgm.namespace)]},
                    "endpoints": [dcgm_endpoint(dcgm.port, args.dcgm_scrape_interval)],
                },
                opts=after_release,
            )
            monitor_name = monitor.metadata.apply(lambda m: str(m["name"]))

        status = release.status
        self.namespace = namespace_name
        self.release_status = status.apply(lambda s: str(s.status))
        self.chart_version = status.apply(lambda s: str(s.version))
        self.grafana_service = status.apply(lambda s: f"{s.namespace}/{s.name}-grafana")
        self.dashboard_name = dashboard_map.metadata.apply(lambda m: str(m["name"]))
        self.dashboard_uid = pulumi.Output.from_input(str(dashboard["uid"]))
        self.rule_name = rule.metadata.apply(lambda m: str(m["name"]))
        self.dcgm_service_monitor = monitor_name
        self.register_outputs(
            {
                "namespace": self.namespace,
                "release_status": self.release_status,
                "chart_version": self.chart_version,
                "grafana_service": self.grafana_service,
                "dashboard_name": self.dashboard_name,
                "dashboard_uid": self.dashboard_uid,
                "rule_name": self.rule_name,
                "dcgm_service_monitor": self.dcgm_service_monitor,
            }
        )
