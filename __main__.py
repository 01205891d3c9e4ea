"""gpu-cluster: turn an existing kubeadm Kubernetes cluster into a GPU platform.

Layers, in the order they are built:
  1. ExtendedResourceNode  - advertise extended resources in node status (JSON patch).
  2. TaintedGpuPool        - taint and label the GPU nodes, keeping Kubernetes' own taints.
  3. ControlPlaneFeatures  - admission plugins and feature gates through kubeadm, host by host.
  4. GpuOperator           - NVIDIA GPU Operator Helm release, tolerating the pool's taint.
  5. BinpackScheduler      - second kube-scheduler that packs GPU pods onto the fewest nodes.
  6. OpaGate               - admission that keeps GPU pods on that scheduler.
  7. MonitoringStack       - Prometheus, DCGM metrics, dashboard and alerts.

This file only wires: read the validated config, build each layer, export outputs.
"""

import pulumi

from components import (
    BinpackScheduler,
    BinpackSchedulerArgs,
    ClusterAccess,
    ControlPlaneFeatures,
    ControlPlaneFeaturesArgs,
    ExtendedResourceNode,
    ExtendedResourceNodeArgs,
    GpuOperator,
    GpuOperatorArgs,
    MonitoringStack,
    MonitoringStackArgs,
    OpaGate,
    OpaGateArgs,
    TaintedGpuPool,
    TaintedGpuPoolArgs,
)
from stack_config import load_stack_config

config = load_stack_config()
for warning in config.warnings:
    pulumi.log.warn(warning)

access = ClusterAccess.create("cluster", config.kubernetes.kubeconfig, config.kubernetes.context)

extended_nodes = {
    node: ExtendedResourceNode(
        f"extended-{node}",
        ExtendedResourceNodeArgs(access=access, node=node, resources=resources),
    )
    for node, resources in config.extended_resources.items()
}

# Before the taint: ExtendedResourceToleration gives pods that request a tainted node's GPU or
# extended resource the matching toleration at admission, so it must be on before the nodes are
# tainted (a NoExecute taint would otherwise evict pods admitted without it).
control_plane = None
if config.control_plane.enabled:
    cp = config.control_plane
    control_plane = ControlPlaneFeatures(
        "control-plane",
        ControlPlaneFeaturesArgs(
            access=access,
            ssh=cp.ssh,
            control_plane_hosts=cp.hosts,
            kubelet_hosts=cp.kubelet_hosts,
            stack=pulumi.get_stack(),
            admission_plugins=cp.admission_plugins,
            feature_gates=cp.feature_gates,
            ready_timeout_seconds=cp.ready_timeout_seconds,
            state_dir=cp.state_dir,
        ),
    )

gpu_pool = TaintedGpuPool(
    "gpu-pool",
    TaintedGpuPoolArgs(
        access=access,
        nodes=config.gpu_pool.nodes,
        taint=config.gpu_pool.taint,
        labels=config.gpu_pool.labels,
    ),
    pulumi.ResourceOptions(depends_on=[control_plane] if control_plane else []),
)

# After the pool: its operands tolerate the pool's taint, taken from the pool's output.
gpu_operator = None
if config.gpu_operator.enabled:
    gpu_operator = GpuOperator(
        "gpu-operator",
        GpuOperatorArgs.of(config.gpu_operator, access=access, taint=gpu_pool.taint),
    )

scheduler = BinpackScheduler(
    "binpack-scheduler",
    BinpackSchedulerArgs(
        access=access,
        kubernetes_version=config.kubernetes_version,
        profile=config.scheduler.profile,
        replicas=config.scheduler.replicas,
    ),
)

# Advertised extended resources are gated too, named by the layer that advertises them.
advertised_names = pulumi.Output.all(*(n.resources for n in extended_nodes.values())).apply(
    lambda maps: sorted({name for counts in maps for name in counts})
)
gate = OpaGate(
    "gpu-gate",
    OpaGateArgs(
        access=access,
        scheduler_name=scheduler.scheduler_name,
        gpu_resources=advertised_names if config.admission.gate_extended_resources else [],
        engine=config.admission.engine,
        failure_policy=config.admission.failure_policy,
        timeout_seconds=config.admission.timeout_seconds,
        replicas=config.admission.replicas,
    ),
)

monitoring = None
if config.monitoring.enabled:
    mon = config.monitoring
    monitoring = MonitoringStack(
        "monitoring",
        MonitoringStackArgs(
            access=access,
            grafana_admin_password=mon.grafana_admin_password,
            grafana_admin_secret=mon.grafana_admin_secret,
            dcgm=gpu_operator.dcgm_target if gpu_operator is not None else None,
            namespace=mon.namespace,
            repository=mon.repository,
            version=mon.version,
            dcgm_scrape_interval=mon.dcgm_scrape_interval,
            values=mon.values,
        ),
    )

pulumi.export("gpuNodes", gpu_pool.nodes)
pulumi.export("gpuTaint", gpu_pool.taint)
pulumi.export("gpuNodeLabels", gpu_pool.labels)
pulumi.export("schedulerName", scheduler.scheduler_name)
pulumi.export("schedulerConfig", scheduler.config_yaml)
pulumi.export("admissionEngine", gate.engine)
pulumi.export("admissionPolicy", gate.policy_name)
pulumi.export("advertisedResources", {node: n.resources for node, n in extended_nodes.items()})
if control_plane is not None:
    pulumi.export("controlPlaneHosts", control_plane.hosts)
    pulumi.export("admissionPlugins", control_plane.admission_plugins)
    pulumi.export("featureGates", control_plane.feature_gates)
    pulumi.export("skippedFeatureGates", control_plane.skipped_gates)
if gpu_operator is not None:
    pulumi.export("gpuOperatorNamespace", gpu_operator.namespace)
    pulumi.export("gpuOperatorRelease", gpu_operator.release_status)
    pulumi.export("gpuOperatorChart", gpu_operator.chart_version)
if monitoring is not None:
    pulumi.export("monitoringRelease", monitoring.release_status)
    pulumi.export("grafanaService", monitoring.grafana_service)
    pulumi.export("gpuDashboard", monitoring.dashboard_name)
    pulumi.export("gpuDashboardUid", monitoring.dashboard_uid)
    pulumi.export("gpuAlertRule", monitoring.rule_name)
    pulumi.export("dcgmServiceMonitor", monitoring.dcgm_service_monitor)
