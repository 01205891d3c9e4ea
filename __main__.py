"""gpu-cluster: turn an existing kubeadm Kubernetes cluster into a GPU platform.

Layers, in the order they are built:
  1. ExtendedResourceNode  - advertise extended resources in node status (JSON patch).
  2. TaintedGpuPool        - taint and label the GPU nodes, keeping Kubernetes' own taints.
  3. ControlPlaneFeatures  - admission plugins and feature gates over SSH (not built yet).
  4. GpuOperator           - NVIDIA GPU Operator Helm release (not built yet).
  5. BinpackScheduler      - second kube-scheduler that packs GPU pods onto the fewest nodes.
  6. OpaGate               - admission that keeps GPU pods on that scheduler.
  7. MonitoringStack       - Prometheus, DCGM metrics, dashboard and alerts (not built yet).

This file only wires: read the validated config, build each layer, export outputs.
"""

import pulumi

from components import (
    BinpackScheduler,
    BinpackSchedulerArgs,
    ClusterAccess,
    ExtendedResourceNode,
    ExtendedResourceNodeArgs,
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

gpu_pool = TaintedGpuPool(
    "gpu-pool",
    TaintedGpuPoolArgs(
        access=access,
        nodes=config.gpu_pool.nodes,
        taint=config.gpu_pool.taint,
        labels=config.gpu_pool.labels,
    ),
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

pulumi.export("gpuNodes", gpu_pool.nodes)
pulumi.export("gpuTaint", gpu_pool.taint)
pulumi.export("gpuNodeLabels", gpu_pool.labels)
pulumi.export("schedulerName", scheduler.scheduler_name)
pulumi.export("schedulerConfig", scheduler.config_yaml)
pulumi.export("admissionEngine", gate.engine)
pulumi.export("admissionPolicy", gate.policy_name)
pulumi.export("advertisedResources", {node: n.resources for node, n in extended_nodes.items()})
