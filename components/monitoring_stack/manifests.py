"""MonitoringStack's objects as data: chart values, the GPU dashboard, alert rules, monitors.

Pure functions, settings in, plain dicts out; components/monitoring_stack/component.py turns them into
resources. The dashboard (components/monitoring_stack/dashboards/gpu.json) and the alert rules
(components/monitoring_stack/alerts/*.rules.yaml) are read from their files and filled in with the GPU resources
the stack counts (in kube-state-metrics' names), dcgm-exporter's job and the GPU Operator's
label for a node taken out of GPU service on purpose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from components.charts import deep_merge
from components.gpu_resources import Allocation, GpuResources
from components.handoffs import DcgmTarget
from components.monitoring_stack import gpu_series
from components.monitoring_stack.settings import (
    KUBE_STATE_METRICS,
    LABELS_ALLOWLIST,
    MonitoringStackSettings,
    parse_labels_allowlist,
)
from components.object_meta import (
    PART_OF,
    POD_SECURITY_ENFORCE,
    NamespaceLabel,
    namespace_labels,
    object_meta,
)
from components.settings import PROJECT

HERE = Path(__file__).resolve().parent
DASHBOARD_FILE = HERE / "dashboards" / "gpu.json"
RULES_FILE = HERE / "alerts" / "gpu.rules.yaml"
GATE_RULES_FILE = HERE / "alerts" / "gate.rules.yaml"
# The expiry of OPA's serving certificate, published by the stack (gate_rule_groups).
CERT_NOT_AFTER_METRIC = "gpu_cluster:opa_serving_cert_not_after:timestamp_seconds"
DASHBOARD_LABEL = "grafana_dashboard"
GRAFANA_USER_KEY = "admin-user"
GRAFANA_PASSWORD_KEY = "admin-password"
GRAFANA_ADMIN_SECRET = "grafana-admin"
DASHBOARD_NAME = "gpu-dashboard"
GPU_ALERTS_RULE = "gpu-alerts"
GATE_ALERTS_RULE = "gpu-gate-alerts"
DCGM_SERVICE_MONITOR = "dcgm-exporter"
MONITORING_API = "monitoring.coreos.com/v1"
# The job label of dcgm-exporter's series (set by dcgm_endpoint): the absence alerts select it.
DCGM_JOB = "dcgm-exporter"
# The GPU Operator's documented way to take every operand (driver, device plugin,
# dcgm-exporter...) off a node on purpose: this node label with this value. The GPU alerts
# leave such a node out (gpu.rules.yaml), reading the label from kube-state-metrics'
# kube_node_labels, which carries it only once allow-listed (stack_values).
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html (Preventing Installation of Operands on Some Nodes)
# Ref: https://github.com/NVIDIA/gpu-operator/blob/v26.3.3/controllers/state_manager.go (hasOperandsDisabled)
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
OPERANDS_DISABLED = "false"
# Placeholders in gpu.rules.yaml, filled in by rule_groups(): PromQL has no variables.
GPU_RESOURCES_PLACEHOLDER = "$gpu_resources"
DCGM_JOB_PLACEHOLDER = "$dcgm_job"
OPERANDS_DISABLED_PLACEHOLDER = "$operands_disabled"
_PLACEHOLDER = re.compile(r"\$[A-Za-z_]")
# The rule group on missing dcgm-exporter data: deployed only when the stack scrapes it.
DCGM_ABSENCE_GROUP = f"{PROJECT}.gpu.absent"
# The dashboard's constant variable holding the same regex (panels use $gpu_resources).
DASHBOARD_RESOURCES_VARIABLE = "gpu_resources"
# kube-state-metrics turns a resource name into a label value by replacing every character
# outside [a-zA-Z0-9_] with `_`: nvidia.com/mig-1g.10gb -> nvidia_com_mig_1g_10gb.
# Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/internal/store/utils.go (sanitizeLabelName)
_KSM_INVALID = re.compile(r"[^a-zA-Z0-9_]")
# kube_<resource>_labels: `label_` + the key sanitised, then snake-cased (a lower case letter or
# digit before an upper case one gets a `_`), all lower case.
_KSM_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
# kube-state-metrics' allowlist entry that exports every label of a resource.
# Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/internal/store/utils.go (createPrometheusLabelKeysValues)
_KSM_EVERY_LABEL = "*"


def grafana_secret_prerequisites(
    namespace: str, secret: str, password: str
) -> list[dict[str, Any]]:
    """What the operator creates before `up` with monitoring.grafanaAdminSecret (README,
    Prerequisites): the namespace (createNamespace false) with the labels the layer's pods need
    (monitoring_namespace_needs), and the Secret with Grafana's admin user and password under
    the keys the layer reads. The local cluster's harness creates them from here."""
    labels = namespace_labels(monitoring_namespace_needs())
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": labels},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "namespace": namespace},
            "stringData": {GRAFANA_USER_KEY: "admin", GRAFANA_PASSWORD_KEY: password},
        },
    ]


def kube_state_metrics_resource(name: str) -> str:
    """A Kubernetes resource name as kube-state-metrics exports it in its `resource` label."""
    return _KSM_INVALID.sub("_", name)


def kube_state_metrics_label(key: str) -> str:
    """The Prometheus label kube-state-metrics' kube_<resource>_labels gives an allow-listed
    Kubernetes label: nvidia.com/gpu.deploy.operands -> label_nvidia_com_gpu_deploy_operands.

    # Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/internal/store/utils.go (labelName)
    """
    return "label_" + _KSM_CAMEL.sub(r"\1_\2", _KSM_INVALID.sub("_", key)).lower()


def labels_allowlist(entries: list[str]) -> list[str]:
    """kube-state-metrics' metricLabelsAllowlist: `entries` (the chart values', checked by the
    settings) with OPERANDS_LABEL added to the node labels, one entry per resource.

    One entry per resource because kube-state-metrics keeps only the last group of a resource
    named twice: a second `nodes=[...]` beside the user's would drop one of them.
    """
    groups = parse_labels_allowlist(entries)
    nodes = groups.setdefault("nodes", [])
    if nodes[:1] != [_KSM_EVERY_LABEL] and OPERANDS_LABEL not in nodes:
        nodes.append(OPERANDS_LABEL)
    return [f"{resource}=[{','.join(labels)}]" for resource, labels in groups.items()]


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


def gpu_dashboard(
    resources: GpuResources,
    path: Path = DASHBOARD_FILE,
    *,
    allocation: Allocation = "device-plugin",
    device_classes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The GPU dashboard as deployed: its `$gpus_<name>` placeholders filled in for
    `allocation` (gpu_series.series, with the node variable's matcher), and its hidden constant
    variable `gpu_resources` holding the regex of `resources`, which the panels and the node
    variable select with."""
    values = gpu_series.series(allocation, dashboard=True, device_classes=device_classes)
    text = gpu_series.fill(path.read_text(), _json_strings(values), path.name)
    dashboard = dict(json.loads(text))
    (variable,) = [
        v for v in dashboard["templating"]["list"] if v["name"] == DASHBOARD_RESOURCES_VARIABLE
    ]
    variable["query"] = gpu_resource_regex(resources)
    return dashboard


def _json_strings(values: Mapping[str, str]) -> dict[str, str]:
    """`values` as they are written inside a JSON string (quotes and backslashes escaped)."""
    return {key: json.dumps(value)[1:-1] for key, value in values.items()}


def load_rule_groups(path: Path = RULES_FILE) -> list[dict[str, Any]]:
    """The alert rule groups, in Prometheus rule-file form (also a PrometheusRule's spec)."""
    return list(yaml.safe_load(path.read_text())["groups"])


def rule_groups(
    resources: GpuResources,
    *,
    dcgm_scraped: bool = True,
    allocation: Allocation = "device-plugin",
    device_classes: tuple[str, ...] = (),
    path: Path = RULES_FILE,
) -> list[dict[str, Any]]:
    """gpu.rules.yaml as deployed: the `$gpus_<name>` placeholders of `allocation`
    (gpu_series.series; in descriptions too), then $gpu_resources, $dcgm_job and
    $operands_disabled filled in, and the group on missing dcgm-exporter data left out when
    nothing scrapes dcgm-exporter (it would fire for good)."""
    shared = gpu_series.series(allocation, dashboard=False, device_classes=device_classes)
    values = {
        GPU_RESOURCES_PLACEHOLDER: gpu_resource_regex(resources),
        DCGM_JOB_PLACEHOLDER: DCGM_JOB,
        OPERANDS_DISABLED_PLACEHOLDER: (
            f'{kube_state_metrics_label(OPERANDS_LABEL)}="{OPERANDS_DISABLED}"'
        ),
    }
    groups = []
    for group in load_rule_groups(path):
        if group["name"] == DCGM_ABSENCE_GROUP and not dcgm_scraped:
            continue
        for rule in group["rules"]:
            expr = gpu_series.fill(str(rule["expr"]), shared, path.name)
            annotations = rule.get("annotations", {})
            for key, text in annotations.items():
                annotations[key] = gpu_series.fill(str(text), shared, path.name)
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
        "name": f"{PROJECT}.gate.published",
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


def stack_values(
    settings: MonitoringStackSettings,
    grafana_secret: str,
    allocation: Allocation = "device-plugin",
) -> dict[str, Any]:
    """The chart values: CRD upgrades, selectors, Grafana admin Secret and sidecar, then
    `settings.values`, then the node label the GPU alerts read in kube-state-metrics'
    allowlist (labels_allowlist: merged with the one in `settings.values`, not replaced), and
    with allocation dra what kube-state-metrics must export of ResourceSlices and
    ResourceClaims (dra_kube_state_metrics: added to the values' own)."""
    typed: dict[str, Any] = {
        # The chart's CRD hook Job (pre-install, pre-upgrade, pre-rollback) runs
        # `kubectl apply --server-side` on the new version's CRDs before Helm touches the
        # release's objects, which are validated against them.
        "crds": {"enabled": True, "upgradeJob": {"enabled": settings.upgrade_crds}},
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
    values = deep_merge(typed, settings.values)
    kube_state_metrics = dict(values.get(KUBE_STATE_METRICS) or {})
    kube_state_metrics[LABELS_ALLOWLIST] = labels_allowlist(
        list(kube_state_metrics.get(LABELS_ALLOWLIST) or [])
    )
    if allocation == "dra":
        kube_state_metrics = dra_kube_state_metrics(kube_state_metrics)
    values[KUBE_STATE_METRICS] = kube_state_metrics
    return values


def dra_kube_state_metrics(chart: Mapping[str, Any]) -> dict[str, Any]:
    """kube-state-metrics' chart values `chart` with the custom resource state configuration
    of DRA (gpu_series.custom_resource_state) and the role's extra rules to read it
    (gpu_series.rbac_rules), each appended to what `chart` already has, so a user's own custom
    resources and rules stay. kube-state-metrics' discovery enables configured custom resources
    by itself: `collectors` (--resources) stays as it is.
    # Ref: https://github.com/prometheus-community/helm-charts/blob/main/charts/kube-state-metrics/templates/crs-configmap.yaml
    # Ref: https://github.com/prometheus-community/helm-charts/blob/main/charts/kube-state-metrics/templates/deployment.yaml (--custom-resource-state-config-file)
    # Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/internal/discovery/discovery.go (PollForCacheUpdates)
    """
    merged = dict(chart)
    crs = dict(merged.get("customResourceState") or {})
    config = dict(crs.get("config") or {})
    ours = gpu_series.custom_resource_state()
    spec = dict(config.get("spec") or {})
    spec["resources"] = list(spec.get("resources") or []) + ours["spec"]["resources"]
    config.setdefault("kind", ours["kind"])
    config["spec"] = spec
    crs.update({"enabled": True, "config": config})
    merged["customResourceState"] = crs
    rbac = dict(merged.get("rbac") or {})
    rbac["extraRules"] = list(rbac.get("extraRules") or []) + gpu_series.rbac_rules()
    merged["rbac"] = rbac
    return merged


def monitoring_namespace_needs() -> tuple[NamespaceLabel, ...]:
    """The labels the layer's pods need on its namespace: on the one it creates, and on an
    existing one it uses (createNamespace false; the ownership check refuses one without them).
    Pod Security's enforce level privileged: kube-prometheus-stack's node-exporter uses the
    host's network, PIDs and paths, and the cluster's default level is in the API server's
    admission configuration, which the stack cannot read. The part-of label is the stack's
    bookkeeping, not a need.
    # Ref: https://kubernetes.io/docs/concepts/security/pod-security-standards/
    """
    return (
        NamespaceLabel(
            POD_SECURITY_ENFORCE,
            "privileged",
            "kube-prometheus-stack's node-exporter uses the host's network, PIDs and paths, "
            "which Pod Security admits only at privileged; the stack cannot read the cluster's "
            "default level, so the namespace must say it",
        ),
    )


def monitoring_namespace(name: str) -> dict[str, Any]:
    """The stack's Namespace: what its pods need (monitoring_namespace_needs) and the stack's
    part-of label."""
    labels = {**PART_OF, **namespace_labels(monitoring_namespace_needs())}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": object_meta(name, labels=labels)}


def grafana_admin_secret(namespace: object, password: object) -> dict[str, Any]:
    """The Secret holding Grafana's admin login, which the chart reads.

    `password` is passed through untouched: the component hands in a Pulumi secret, so it
    stays one.
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(GRAFANA_ADMIN_SECRET, namespace, PART_OF),
        "type": "Opaque",
        "stringData": {GRAFANA_USER_KEY: "admin", GRAFANA_PASSWORD_KEY: password},
    }


def dashboard_config_map(dashboard: Mapping[str, Any], namespace: object) -> dict[str, Any]:
    """The ConfigMap Grafana's sidecar loads `dashboard` from (labelled DASHBOARD_LABEL=1)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(DASHBOARD_NAME, namespace, {**PART_OF, DASHBOARD_LABEL: "1"}),
        "data": {"gpu.json": json.dumps(dashboard, indent=2, sort_keys=True)},
    }


def prometheus_rule(name: str, namespace: object, groups: object) -> dict[str, Any]:
    """A PrometheusRule with `groups` (a list of rule groups, or the component's Output of one,
    passed through untouched)."""
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": object_meta(name, namespace, PART_OF),
        "spec": {"groups": groups},
    }


def gpu_alerts_rule(
    resources: GpuResources,
    namespace: object,
    *,
    dcgm_scraped: bool,
    allocation: Allocation = "device-plugin",
    device_classes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The PrometheusRule gpu-alerts: gpu.rules.yaml as deployed (rule_groups)."""
    groups = rule_groups(
        resources,
        dcgm_scraped=dcgm_scraped,
        allocation=allocation,
        device_classes=device_classes,
    )
    return prometheus_rule(GPU_ALERTS_RULE, namespace, groups)


def dcgm_service_monitor(namespace: object, target: DcgmTarget, interval: str) -> dict[str, Any]:
    """The one ServiceMonitor scraping dcgm-exporter: `target`'s Service (its namespace a
    name, or an Output of one), through dcgm_endpoint."""
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": object_meta(DCGM_SERVICE_MONITOR, namespace, PART_OF),
        "spec": {
            "selector": {"matchLabels": dict(target.selector)},
            "namespaceSelector": {"matchNames": [target.namespace]},
            "endpoints": [dcgm_endpoint(target.port, interval)],
        },
    }
