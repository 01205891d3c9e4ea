"""BinpackScheduler's manifests: its KubeSchedulerConfiguration and its Kubernetes objects, as data.

Pure functions, settings and plain values in, dicts out; the component turns them into resources
and the bench and the tests render the same configuration. The scheduler runs as a Deployment of
registry.k8s.io/kube-scheduler:<kubernetesVersion> (or `image`) in kube-system, reading a
kubescheduler.config.k8s.io/v1 configuration from a ConfigMap whose hash is a pod annotation (a
config change rolls the pods). It authenticates with its ServiceAccount (no hostPath to the
control plane's scheduler.conf), serves HTTPS on 10259 with /livez and /readyz probes, runs with
system-cluster-critical priority, tolerates the control-plane taint and elects a leader on its
own Lease named after the scheduler. RBAC is kubeadm's scheduler roles plus one Role on that
Lease, because system:kube-scheduler only covers the Lease named kube-scheduler.

# Ref: https://kubernetes.io/docs/reference/scheduling/config/
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from components.binpack_scheduler_settings import FRAGMENTATION, SchedulerProfile
from components.object_meta import PART_OF
from components.settings import PROJECT

CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/kubernetes/gpu-binpack-scheduler"
CONFIG_HASH_ANNOTATION = f"{PROJECT}.io/config-sha256"
SECURE_PORT = 10259
BALANCED_ALLOCATION = "NodeResourcesBalancedAllocation"
NODE_RESOURCES_FIT = "NodeResourcesFit"
FRAGMENTATION_PLUGIN = "GpuFragmentation"
# Its weight against the score plugins the profile keeps (TaintToleration 3, NodeAffinity 2,
# PodTopologySpread 2, InterPodAffinity 2, ImageLocality 1): fragmentation decides, a pod's
# own preferences still break its near-ties.
FRAGMENTATION_WEIGHT = 10


def render_config(profile: SchedulerProfile, kubeconfig: str | None = None) -> dict[str, Any]:
    """The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) for `profile`.

    With `kubeconfig`, the scheduler connects with that file (local runs); without, it uses
    its in-cluster service-account credentials.
    """
    if profile.scoring == FRAGMENTATION:
        entry = _fragmentation_entry(profile)
    else:
        entry = _binpack_entry(profile)
    if profile.percentage_of_nodes_to_score is not None:
        entry["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # Its own Lease, so it never contends with the cluster's kube-scheduler and two
        # replicas of this scheduler never both schedule.
        "leaderElection": {
            "leaderElect": profile.leader_elect,
            "resourceName": profile.scheduler_name,
            "resourceNamespace": profile.lease_namespace,
        },
        "profiles": [entry],
    }
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    return config


def _fragmentation_entry(profile: SchedulerProfile) -> dict[str, Any]:
    """GpuFragmentation scores; NodeResourcesFit still filters (its score is turned off, as
    is BalancedAllocation's: both would pull against it). It also counts every arriving pod
    (preFilter, so pods that fit one node or none are counted too) and follows its own
    placements (reserve). Its arguments name the GPU resources as the GPU Operator's settings
    advertise them; the rest keep the plugin's defaults (scheduler/fragmentation/args.go)."""
    plugin = [{"name": FRAGMENTATION_PLUGIN}]
    args: dict[str, Any] = {
        "gpuResources": list(profile.gpu_resource_names),
        "migResourcePrefix": profile.mig_prefix,
    }
    if profile.shared_gpus:
        args["sharedResources"] = [{"name": n, "replicas": r} for n, r in profile.shared_gpus]
    return {
        "schedulerName": profile.scheduler_name,
        "plugins": {
            "preFilter": {"enabled": plugin},
            "preScore": {"enabled": plugin},
            "reserve": {"enabled": plugin},
            "score": {
                "enabled": [{"name": FRAGMENTATION_PLUGIN, "weight": FRAGMENTATION_WEIGHT}],
                "disabled": [{"name": NODE_RESOURCES_FIT}, {"name": BALANCED_ALLOCATION}],
            },
        },
        "pluginConfig": [{"name": FRAGMENTATION_PLUGIN, "args": args}],
    }


def _binpack_entry(profile: SchedulerProfile) -> dict[str, Any]:
    """RequestedToCapacityRatio with the profile's weights and shape, and BalancedAllocation."""
    fit_args = {
        "scoringStrategy": {
            "type": "RequestedToCapacityRatio",
            "resources": [{"name": r.name, "weight": r.weight} for r in profile.resources],
            "requestedToCapacityRatio": {
                "shape": [{"utilization": p.utilization, "score": p.score} for p in profile.shape]
            },
        }
    }
    entry: dict[str, Any] = {
        "schedulerName": profile.scheduler_name,
        "pluginConfig": [{"name": NODE_RESOURCES_FIT, "args": fit_args}],
    }
    # BalancedAllocation is a default score plugin (weight 1, cpu and memory); naming it in
    # `enabled` replaces its weight, `disabled` removes it.
    # Ref: https://kubernetes.io/docs/reference/scheduling/config/#scheduling-plugins
    if profile.balanced_weight == 0:
        entry["plugins"] = {"score": {"disabled": [{"name": BALANCED_ALLOCATION}]}}
    else:
        entry["plugins"] = {
            "score": {"enabled": [{"name": BALANCED_ALLOCATION, "weight": profile.balanced_weight}]}
        }
        # The plugin accepts only weight 1 per resource: it balances shares, it does not weigh.
        entry["pluginConfig"].append(
            {
                "name": BALANCED_ALLOCATION,
                "args": {
                    "resources": [{"name": r, "weight": 1} for r in profile.balanced_resources]
                },
            }
        )
    return entry


def render_config_yaml(profile: SchedulerProfile, kubeconfig: str | None = None) -> str:
    """`render_config` as YAML: the file the ConfigMap holds and the scheduler reads."""
    return yaml.safe_dump(render_config(profile, kubeconfig), sort_keys=False)


# ------------------------------------------------------------------ Kubernetes objects
RBAC_API_GROUP = "rbac.authorization.k8s.io"
LEASE = "lease"
"""Suffix of the Role on the scheduler's own Lease and of its binding."""
# (suffix, role kind, role, namespace of the binding; None: cluster-wide). The two roles
# kubeadm's own scheduler has, nothing broader; delegated authentication of the HTTPS endpoint
# reads a ConfigMap in kube-system.
SCHEDULER_ROLES: tuple[tuple[str, str, str, str | None], ...] = (
    ("kube-scheduler", "ClusterRole", "system:kube-scheduler", None),
    ("volume-scheduler", "ClusterRole", "system:volume-scheduler", None),
    ("auth-reader", "Role", "extension-apiserver-authentication-reader", "kube-system"),
)


def labels(scheduler_name: str) -> dict[str, str]:
    """The labels of every object, and the Deployment's selector."""
    return {"app.kubernetes.io/name": scheduler_name, **PART_OF}


def object_meta(name: str, scheduler_name: str, namespace: str | None) -> dict[str, Any]:
    """Metadata of one object: `name`, in `namespace` (None: cluster-scoped), labelled."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels(scheduler_name)
    return meta


def config_map(scheduler_name: str, namespace: str, config_yaml: str) -> dict[str, Any]:
    """The ConfigMap holding the rendered KubeSchedulerConfiguration."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(scheduler_name, scheduler_name, namespace),
        "data": {CONFIG_KEY: config_yaml},
    }


def service_account(scheduler_name: str, namespace: str) -> dict[str, Any]:
    """The ServiceAccount the scheduler authenticates with."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(scheduler_name, scheduler_name, namespace),
    }


def lease_role(scheduler_name: str, lease_namespace: str) -> dict[str, Any]:
    """The Role on the scheduler's own Lease: system:kube-scheduler may get/update only the
    Lease named kube-scheduler, this one needs the same two verbs on its own name."""
    return {
        "apiVersion": f"{RBAC_API_GROUP}/v1",
        "kind": "Role",
        "metadata": object_meta(f"{scheduler_name}:{LEASE}", scheduler_name, lease_namespace),
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [scheduler_name],
                "verbs": ["get", "update"],
            }
        ],
    }


def role_ref(kind: str, name: str) -> dict[str, str]:
    """A binding's reference to the Role or ClusterRole `name`."""
    return {"apiGroup": RBAC_API_GROUP, "kind": kind, "name": name}


def role_binding(
    scheduler_name: str,
    namespace: str,
    suffix: str,
    ref: Mapping[str, str],
    binding_namespace: str | None,
) -> dict[str, Any]:
    """Bind the ServiceAccount in `namespace` to `ref`: a RoleBinding in `binding_namespace`,
    or a ClusterRoleBinding when that is None."""
    return {
        "apiVersion": f"{RBAC_API_GROUP}/v1",
        "kind": "ClusterRoleBinding" if binding_namespace is None else "RoleBinding",
        "metadata": object_meta(f"{scheduler_name}:{suffix}", scheduler_name, binding_namespace),
        "roleRef": dict(ref),
        "subjects": [{"kind": "ServiceAccount", "name": scheduler_name, "namespace": namespace}],
    }


def role_bindings(
    scheduler_name: str, namespace: str, lease_namespace: str
) -> dict[str, dict[str, Any]]:
    """Every binding of the scheduler's ServiceAccount, by suffix: the scheduler roles, then
    the Role on its Lease (`lease_role`)."""
    bindings = {
        suffix: role_binding(scheduler_name, namespace, suffix, role_ref(kind, role), where)
        for suffix, kind, role, where in SCHEDULER_ROLES
    }
    lease = role_ref("Role", lease_role(scheduler_name, lease_namespace)["metadata"]["name"])
    bindings[LEASE] = role_binding(scheduler_name, namespace, LEASE, lease, lease_namespace)
    return bindings


def deployment(
    scheduler_name: str,
    namespace: str,
    *,
    replicas: int,
    image: str,
    requests: Mapping[str, str],
    config_yaml: str,
    service_account: str,
    config_map: str,
) -> dict[str, Any]:
    """The Deployment: `replicas` pods of `image` reading `config_yaml` from the ConfigMap
    `config_map`, as the ServiceAccount `service_account`, spread over nodes."""
    selected = labels(scheduler_name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(scheduler_name, scheduler_name, namespace),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selected},
            "template": {
                "metadata": {
                    "labels": selected,
                    # A new config rolls the pods; the scheduler reads it only at start.
                    "annotations": {
                        CONFIG_HASH_ANNOTATION: hashlib.sha256(config_yaml.encode()).hexdigest()
                    },
                },
                "spec": pod_spec(
                    scheduler_name,
                    container=scheduler_container(image, requests),
                    service_account=service_account,
                    config_map=config_map,
                ),
            },
        },
    }


def pod_spec(
    scheduler_name: str, *, container: dict[str, Any], service_account: str, config_map: str
) -> dict[str, Any]:
    """A critical pod on the control plane (tolerated) or anywhere, preferring a node without
    another replica, with the ConfigMap `config_map` as its config volume."""
    return {
        "serviceAccountName": service_account,
        "priorityClassName": "system-cluster-critical",
        "tolerations": [
            {
                "key": "node-role.kubernetes.io/control-plane",
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        ],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": labels(scheduler_name)},
                        },
                    }
                ]
            }
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": config_map}}],
    }


def scheduler_container(image: str, requests: Mapping[str, str]) -> dict[str, Any]:
    """kube-scheduler reading the mounted config, serving HTTPS with /livez and /readyz."""
    probe = {"scheme": "HTTPS", "port": SECURE_PORT}
    return {
        "name": "kube-scheduler",
        "image": image,
        "command": [
            "kube-scheduler",
            f"--config={CONFIG_DIR}/{CONFIG_KEY}",
            f"--secure-port={SECURE_PORT}",
            "--v=2",
        ],
        "ports": [{"name": "https", "containerPort": SECURE_PORT}],
        "livenessProbe": {
            "httpGet": {**probe, "path": "/livez"},
            "initialDelaySeconds": 15,
            "periodSeconds": 10,
            "failureThreshold": 8,
        },
        "readinessProbe": {"httpGet": {**probe, "path": "/readyz"}, "periodSeconds": 10},
        "resources": {"requests": dict(requests)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
