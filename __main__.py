"""gpu-cluster: turn an existing kubeadm Kubernetes cluster into a GPU platform.

Layers, in the order they are built:
  1. ExtendedResourceNodes - advertise extended resources in node status (JSON patch).
  2. TaintedGpuPool        - taint and label the GPU nodes, keeping Kubernetes' own taints.
  3. ControlPlaneFeatures  - admission plugins and feature gates over SSH, one host at a time.
  4. GpuOperator           - NVIDIA GPU Operator Helm release, tolerating the pool's taint.
  5. BinpackScheduler      - second kube-scheduler that packs GPU pods onto the fewest nodes.
  6. OpaGate               - admission that routes GPU pods to that scheduler (or refuses them).
  7. MonitoringStack       - Prometheus, DCGM metrics, dashboard and alerts.
  8. GpuPriorityClasses    - PriorityClasses for GPU workloads.

This file only wires: read the validated config, build each layer, export outputs.
"""

import pulumi

from components import (
    BinpackScheduler,
    BinpackSchedulerArgs,
    ClusterAccess,
    ControlPlaneFeatures,
    ControlPlaneFeaturesArgs,
    ExtendedResourceNodes,
    ExtendedResourceNodesArgs,
    GpuOperator,
    GpuOperatorArgs,
    GpuPriorityClasses,
    GpuPriorityClassesArgs,
    MonitoringStack,
    MonitoringStackArgs,
    OpaGate,
    OpaGateArgs,
    TaintedGpuPool,
    TaintedGpuPoolArgs,
)
from components.binpack_scheduler.settings import (
    GANG_FEATURE_GATE,
    GANG_GROUP_VERSION,
    GANG_RESOURCE,
)
from components.cluster_access import (
    check_pool_workloads,
    check_served_api,
    check_version_skew,
)
from components.gpu_resources import is_gpu_resource
from components.opa_gate.manifests import excluded_namespaces
from components.opa_gate.preview import check_pool_toleration
from components.opa_gate.settings import DEFAULT_GATE_NAMESPACE
from stack_config import load_stack_config, server_toleration_of
from stack_outputs import export_outputs

config = load_stack_config()
for warning in config.warnings:
    pulumi.log.warn(warning)

# The scheduler image's version against the live API server's, before anything is declared:
# newer is refused; far older, or a cluster out of reach, is a warning.
skew_warning = check_version_skew(
    config.kubernetes.kubeconfig, config.kubernetes.context, config.kubernetes_version
)
if skew_warning:
    pulumi.log.warn(skew_warning)

# Gangs without ControlPlaneFeatures: the cluster must serve PodGroups already.
if config.scheduler.gang_scheduling and not config.control_plane.enabled:
    gang_warning = check_served_api(
        config.kubernetes.kubeconfig,
        config.kubernetes.context,
        "scheduler.gangScheduling",
        GANG_GROUP_VERSION,
        GANG_RESOURCE,
        f"start the API servers with --feature-gates={GANG_FEATURE_GATE}=true and "
        f"--runtime-config={GANG_GROUP_VERSION}=true, or set controlPlane.enabled so the stack "
        "does",
    )
    if gang_warning:
        pulumi.log.warn(gang_warning)

# A refusing engine, and no ExtendedResourceToleration from controlPlane: GPU pods tolerate the
# pool's taint only if the API server runs the plugin itself. A dry-run GPU pod asks it: no
# toleration is refused, a cluster out of reach (or refusing the probe) is a warning.
toleration_resource = server_toleration_of(config)
if toleration_resource is not None:
    toleration_warning = check_pool_toleration(
        config.kubernetes.kubeconfig,
        config.kubernetes.context,
        engine=config.admission.engine,
        kubernetes_version=config.kubernetes_version,
        taint=config.gpu_pool.taint.as_dict(),
        resource=toleration_resource,
    )
    if toleration_warning:
        pulumi.log.warn(toleration_warning)

# The gate refuses a new pod that asks for no GPU yet tolerates the pool's taint outside
# admission.poolNamespaces and poolDaemonSets: a workload already on the cluster that would lose
# its next pods (a CNI's node agent tolerating every taint, say) is refused here, by name; a
# cluster out of reach is a warning.
gated_resources = config.scheduler.gpu_resources_with(config.gpu_operator.gpu_resources())
if config.admission.gate_extended_resources:
    gated_resources = gated_resources.adding(
        {name for counts in config.extended_resources.values() for name in counts}
    )
operator_pods = config.gpu_operator.operator_pods(config.admission.external_gpu_operator_namespace)
pool_warning = check_pool_workloads(
    config.kubernetes.kubeconfig,
    config.kubernetes.context,
    taint=config.gpu_pool.taint.as_dict(),
    allowed_namespaces=config.pool_namespaces,
    allowed_daemonsets=config.admission.pool_daemon_sets,
    skipped_namespaces=excluded_namespaces(
        DEFAULT_GATE_NAMESPACE, *([operator_pods.namespace] if operator_pods else [])
    ),
    gpu_resource=lambda name: is_gpu_resource(name, gated_resources),
)
if pool_warning:
    pulumi.log.warn(pool_warning)

# The claim on the cluster, written only once every object declared in the block was checked
# live: none may exist that this stack did not create. Leaving the block checks them and lets
# everything apply; an error inside it fails the run (nothing waits for a check never made).
with ClusterAccess.create(
    "cluster",
    config.kubernetes.kubeconfig,
    config.kubernetes.context,
    sections=config.layer_sections,
    retake_claim=config.retake_claim,
) as access:
    extended = ExtendedResourceNodes(
        "extended-resources",
        ExtendedResourceNodesArgs.from_settings(config.extended_resources, access=access),
    )

    # Before the taint: ExtendedResourceToleration gives pods that request a tainted node's GPU or
    # extended resource the matching toleration at admission, so it must be on before the nodes are
    # tainted (GPU pods admitted before it would lack it).
    control_plane = None
    if config.control_plane.enabled:
        control_plane = ControlPlaneFeatures(
            "control-plane",
            ControlPlaneFeaturesArgs.from_settings(
                config.control_plane,
                access=access,
                ssh_private_key=config.ssh_private_key,
                inventory=config.nodes,
                needs=config.scheduler.control_plane_needs,
            ),
        )

    # After the extended resources too: both layers write the same Node objects, and one after the
    # other neither layer's writes conflict with the other's.
    gpu_pool = TaintedGpuPool(
        "gpu-pool",
        TaintedGpuPoolArgs.from_settings(config.gpu_pool, access=access),
        pulumi.ResourceOptions(depends_on=[extended, *([control_plane] if control_plane else [])]),
    )

    # After the pool: its operands tolerate the pool's taint, taken from the pool's output.
    gpu_operator = None
    if config.gpu_operator.enabled:
        gpu_operator = GpuOperator(
            "gpu-operator",
            GpuOperatorArgs.from_settings(
                config.gpu_operator, access=access, pool_toleration=gpu_pool.toleration
            ),
        )

    # After ControlPlaneFeatures when it turns on what the scheduler needs (gangs: the
    # GenericWorkload gate and PodGroups): a first `up` does not start it before the API servers
    # serve them.
    needs = config.scheduler.control_plane_needs
    scheduler = BinpackScheduler(
        "binpack-scheduler",
        BinpackSchedulerArgs.from_settings(
            config.scheduler,
            access=access,
            kubernetes_version=config.kubernetes_version,
            advertised=config.gpu_operator.gpu_resources(),
        ),
        pulumi.ResourceOptions(
            depends_on=[control_plane]
            if control_plane is not None and (needs.feature_gates or needs.runtime_config)
            else []
        ),
    )
    # What GPU pods ask for, as the scheduler weighs it: what the GPU Operator's settings advertise
    # (time-slicing renamed, MIG mixed) and scheduler.gpuResources adds; gated and routed with the
    # pool's toleration by the gate, counted by the monitoring.
    gpu_resources = scheduler.gpu_resources

    # Advertised extended resources are named by the layer that advertises them.
    advertised_names = extended.resources.apply(
        lambda nodes: sorted({name for counts in nodes.values() for name in counts})
    )
    gate = OpaGate(
        "gpu-gate",
        OpaGateArgs.from_settings(
            config.admission,
            access=access,
            scheduler_name=scheduler.scheduler_name,
            gpu_resources=advertised_names,
            device_resources=gpu_resources.names,
            gpu_resource_prefixes=gpu_resources.prefixes,
            pool_toleration=gpu_pool.toleration,
            # Pods that ask for no GPU stay off the pool's nodes outside these namespaces and
            # DaemonSets (the monitoring namespace included).
            pool_nodes=gpu_pool.nodes,
            pool_namespaces=config.pool_namespaces,
            operator_pods=operator_pods,
            gang_pods=config.scheduler.gang_scheduling,
            gang_namespaces=config.scheduler.gang_namespaces,
            # Layer 8's classes (none when it is off) are for GPU pods, and the namespaces listed.
            priority_classes=config.priority_classes.created_names(),
            priority_class_namespaces=config.priority_classes.allowed_namespaces,
            device_classes=config.gpu_operator.device_classes(),
            device_drivers=config.gpu_operator.device_drivers(),
            allocator=scheduler.identity,
        ),
    )

    monitoring = None
    if config.monitoring.enabled:
        monitoring = MonitoringStack(
            "monitoring",
            MonitoringStackArgs.from_settings(
                config.monitoring,
                access=access,
                grafana_admin_password=config.grafana_admin_password,
                dcgm=gpu_operator.dcgm_target if gpu_operator is not None else None,
                gpu_resources=gpu_resources,
                device_classes=config.gpu_operator.device_classes(),
                opa_serving_cert_not_after=(
                    gate.serving_cert_not_after if config.admission.engine == "opa" else None
                ),
            ),
        )

    priority_classes = None
    if config.priority_classes.enabled:
        priority_classes = GpuPriorityClasses(
            "priority-classes",
            GpuPriorityClassesArgs.from_settings(config.priority_classes, access=access),
        )

    outputs = {
        "gpuNodes": gpu_pool.nodes,
        "gpuTaint": gpu_pool.taint,
        "gpuNodeLabels": gpu_pool.labels,
        "schedulerName": scheduler.scheduler_name,
        "schedulerConfig": scheduler.config_yaml,
        "admissionEngine": gate.engine,
        "admissionPolicy": gate.policy_name,
        "advertisedResources": extended.resources,
    }
    if control_plane is not None:
        outputs |= {
            "controlPlaneHosts": control_plane.hosts,
            "admissionPlugins": control_plane.admission_plugins,
            "featureGates": control_plane.feature_gates,
            "skippedFeatureGates": control_plane.skipped_gates,
        }
    if gpu_operator is not None:
        outputs |= {
            "gpuOperatorNamespace": gpu_operator.namespace,
            "gpuOperatorRelease": gpu_operator.release_status,
            "gpuOperatorChart": gpu_operator.chart_version,
        }
        if config.gpu_operator.allocation == "dra":
            outputs["gpuDeviceClasses"] = gpu_operator.device_classes
    if monitoring is not None:
        outputs |= {
            "monitoringNamespace": monitoring.namespace,
            "monitoringRelease": monitoring.release_status,
            "grafanaService": monitoring.grafana_service,
            "gpuDashboard": monitoring.dashboard_name,
            "gpuDashboardUid": monitoring.dashboard_uid,
            "gpuAlertRule": monitoring.rule_name,
            "dcgmServiceMonitor": monitoring.dcgm_service_monitor,
        }
    if priority_classes is not None:
        outputs["gpuPriorityClasses"] = priority_classes.names
    export_outputs(outputs)
