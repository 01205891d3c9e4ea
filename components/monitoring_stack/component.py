"""MonitoringStack: kube-prometheus-stack, the DCGM ServiceMonitor, a GPU dashboard and alerts.

- kube-prometheus-stack as a `helm.v3.Release` (pinned). Its Prometheus selects every
  ServiceMonitor, PodMonitor and PrometheusRule in the cluster
  (`*SelectorNilUsesHelmValues: false`), so nothing here needs the release label.
- Grafana's admin password comes from a Pulumi secret, stored in a Kubernetes Secret the chart
  reads (`grafana.admin.existingSecret`), or from a Secret that already exists; never the chart
  default. Grafana's sidecar loads dashboards from ConfigMaps labelled grafana_dashboard=1.
- The GPU dashboard (components/monitoring_stack/dashboards/gpu.json): utilisation (DCGM_FI_DEV_GPU_UTIL, or
  DCGM_FI_PROF_GR_ENGINE_ACTIVE on MIG GPUs, which have no GPU_UTIL) and framebuffer memory
  (MiB) per node and per workload pod, allocated vs allocatable and free GPUs per node and GPU
  resource, temperature, power and XID codes. The PrometheusRule gpu-alerts
  (components/monitoring_stack/alerts/gpu.rules.yaml): a new XID code (hardware, or raised by the application),
  GPU above 85 C for 5 minutes, a GPU pod unschedulable for 10 minutes, a GPU node with nothing
  allocatable for 5 minutes (device plugin down, GPUs unhealthy), and, when the stack scrapes
  dcgm-exporter, GPU nodes without its metrics and no dcgm-exporter target at all. A node
  whose GPU Operator operands were removed on purpose (labelled
  nvidia.com/gpu.deploy.operands=false) counts as no GPU node for those, so the chart values
  allow-list that label in kube-state-metrics (stack_values).
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

from typing import Annotated, Any, Self

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from components.cluster_access import ClusterAccess, ClusterLayer
from components.gpu_resources import WHOLE_GPU, Allocation, GpuResources
from components.handoffs import DcgmTarget
from components.monitoring_stack.manifests import (
    GATE_ALERTS_RULE,
    dashboard_config_map,
    dcgm_service_monitor,
    gate_rule_groups,
    gpu_alerts_rule,
    gpu_dashboard,
    grafana_admin_secret,
    monitoring_namespace,
    monitoring_namespace_needs,
    prometheus_rule,
    stack_values,
)
from components.monitoring_stack.settings import CHART, MonitoringStackSettings
from components.settings import PROJECT, Runtime

TOKEN = f"{PROJECT}:index:MonitoringStack"
RELEASE_NAME = "kube-prometheus-stack"


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
    device_classes: Annotated[tuple[str, ...], Runtime()] = ()
    """The DeviceClasses GPUs are claimed from (GpuOperatorSettings.device_classes()): none
    with the device plugin; with allocation dra the dashboard and alerts count the DRA
    driver's published and allocated devices instead of node allocatable (gpu_series), and
    kube-state-metrics exports them."""

    @property
    def allocation(self) -> Allocation:
        """The allocation model the dashboard and alerts count GPUs by."""
        return "dra" if self.device_classes else "device-plugin"

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


def _metadata_name(resource: Any) -> pulumi.Output[str]:
    """A created object's metadata.name."""
    return resource.metadata.apply(lambda m: str(m["name"]))


def _custom_resource(
    name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions
) -> k8s.apiextensions.CustomResource:
    """A custom object (PrometheusRule, ServiceMonitor) from its plain dict."""
    return k8s.apiextensions.CustomResource(
        name,
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        metadata=obj["metadata"],
        spec=obj["spec"],
        opts=opts,
    )


class MonitoringStack(ClusterLayer):
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
        super().__init__(TOKEN, name, args.access, opts)
        namespace = self._namespace(args)
        grafana_secret = self._grafana_secret(args, namespace)
        release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            **CHART.release_chart(args.repository, args.version),
            namespace=namespace,
            values=grafana_secret.apply(lambda secret: stack_values(args, secret, args.allocation)),
            opts=self.children,
        )
        # The CRDs (ServiceMonitor, PrometheusRule) arrive with the release.
        after_release = pulumi.ResourceOptions.merge(
            self.children, pulumi.ResourceOptions(depends_on=[release])
        )

        dashboard = gpu_dashboard(
            args.gpu_resources, allocation=args.allocation, device_classes=args.device_classes
        )
        config_map = dashboard_config_map(dashboard, namespace)
        dashboard_map = k8s.core.v1.ConfigMap(
            f"{name}-gpu-dashboard",
            metadata=config_map["metadata"],
            data=config_map["data"],
            opts=self.children,
        )
        rule = self._alerts(args, namespace, after_release)
        monitor_name = self._dcgm_monitor(args, namespace, after_release)

        status = release.status
        self.namespace = pulumi.Output.from_input(namespace)
        self.release_status = status.apply(lambda s: str(s.status))
        self.chart_version = status.apply(lambda s: str(s.version))
        self.grafana_service = status.apply(lambda s: f"{s.namespace}/{s.name}-grafana")
        self.dashboard_name = _metadata_name(dashboard_map)
        self.dashboard_uid = pulumi.Output.from_input(str(dashboard["uid"]))
        self.rule_name = _metadata_name(rule)
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

    def _namespace(self, args: MonitoringStackArgs) -> str:
        """The stack's namespace: created here unless createNamespace is false (then it must
        exist with the labels monitoring_namespace_needs names, and destroy leaves it). Its name
        is plain, so the stack checks its objects before applying any; the children declared
        after this wait for the namespace it creates."""
        if not args.create_namespace:
            args.access.use_namespace(self, args.namespace, monitoring_namespace_needs())
            return args.namespace
        namespace = k8s.core.v1.Namespace(
            f"{self.pulumi_resource_name}-namespace",
            metadata=monitoring_namespace(args.namespace)["metadata"],
            opts=self.children,
        )
        self.children = pulumi.ResourceOptions.merge(
            self.children, pulumi.ResourceOptions(depends_on=[namespace])
        )
        return args.namespace

    def _grafana_secret(self, args: MonitoringStackArgs, namespace: str) -> pulumi.Output[str]:
        """The name of the Secret with Grafana's admin login: created from the password, or
        the existing one named in the settings."""
        if args.grafana_admin_password is None:
            return pulumi.Output.from_input(str(args.grafana_admin_secret))
        password = pulumi.Output.secret(args.grafana_admin_password)
        secret = grafana_admin_secret(namespace, password)
        return _metadata_name(
            k8s.core.v1.Secret(
                f"{self.pulumi_resource_name}-grafana-admin",
                metadata=secret["metadata"],
                type=secret["type"],
                string_data=secret["stringData"],
                opts=self.children,
            )
        )

    def _alerts(
        self, args: MonitoringStackArgs, namespace: str, opts: pulumi.ResourceOptions
    ) -> k8s.apiextensions.CustomResource:
        """The PrometheusRule gpu-alerts, and the gate's when OpaGate runs OPA."""
        dcgm_scraped = args.dcgm is not None
        rule = _custom_resource(
            f"{self.pulumi_resource_name}-gpu-alerts",
            gpu_alerts_rule(
                args.gpu_resources,
                namespace,
                dcgm_scraped=dcgm_scraped,
                allocation=args.allocation,
                device_classes=args.device_classes,
            ),
            opts,
        )
        if args.opa_serving_cert_not_after is not None:
            # Alerts before the admission webhook's serving certificate expires.
            not_after = pulumi.Output.from_input(args.opa_serving_cert_not_after)
            gate_rule = prometheus_rule(
                GATE_ALERTS_RULE, namespace, not_after.apply(gate_rule_groups)
            )
            _custom_resource(f"{self.pulumi_resource_name}-gate-alerts", gate_rule, opts)
        return rule

    def _dcgm_monitor(
        self, args: MonitoringStackArgs, namespace: str, opts: pulumi.ResourceOptions
    ) -> pulumi.Output[str]:
        """The ServiceMonitor scraping dcgm-exporter: its name, "" when there is none."""
        if args.dcgm is None:
            return pulumi.Output.from_input("")
        monitor = dcgm_service_monitor(namespace, args.dcgm, args.dcgm_scrape_interval)
        return _metadata_name(
            _custom_resource(f"{self.pulumi_resource_name}-dcgm-exporter", monitor, opts)
        )
