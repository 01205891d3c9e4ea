"""BinpackScheduler's manifests: its KubeSchedulerConfiguration and its Kubernetes objects, as data.

Pure functions, settings and plain values in, dicts out; the component turns them into resources
and the bench and the tests render the same configuration. The scheduler runs as a Deployment of
registry.k8s.io/kube-scheduler:<kubernetesVersion> (or `image`) in kube-system, reading a
kubescheduler.config.k8s.io/v1 configuration from a ConfigMap whose hash is a pod annotation (a
config change rolls the pods). It authenticates with its ServiceAccount (no hostPath to the
control plane's scheduler.conf), serves HTTPS on 10259 with /livez and /readyz probes, runs with
system-cluster-critical priority, tolerates the control-plane taint and elects a leader on its
own Lease named after the scheduler.

RBAC is its own, not kubeadm's: system:kube-scheduler may create any Lease and update the
cluster scheduler's (kube-system/kube-scheduler), so an image bound to it could take that
leadership and stop all default scheduling. The scheduler's ClusterRole carries what
system:kube-scheduler and system:volume-scheduler grant a scheduler (nodes, pods and their
bindings, status and finalizers, events, what selects or mounts pods, DRA objects), without
their Lease and LeaseCandidate rules; a Role lets it get and update its own Lease, by name.
`create` cannot be limited to a name, so the stack creates that Lease itself (an empty spec,
which leader election fills in) and the scheduler never creates one.

# Ref: https://kubernetes.io/docs/reference/scheduling/config/
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from components.binpack_scheduler.settings import FRAGMENTATION, SchedulerProfile
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
# Pods that ask for DRA GPUs through ResourceClaims: scheduler/fragmentation/claimbinpack.go.
CLAIM_BINPACK_PLUGIN = "GpuClaimBinpack"


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
    if profile.claim_binpack:
        _add_claim_binpack(entry, profile)
    return entry


def claim_binpack_weight(profile: SchedulerProfile) -> int:
    """GpuClaimBinpack's plugin weight: for a claim pod, NodeResourcesFit scores cpu and memory
    alone (their weighted mean, at plugin weight 1), so the GPU score weighs what
    RequestedToCapacityRatio gives the GPU against them: the GPU weight over the weights of
    the other resources (1 to 100; 1 when the profile weighs GPUs only)."""
    others = sum(r.weight for r in profile.resources if r.name not in profile.gpu_resource_names)
    if others == 0:
        return 1
    return max(1, min(100, round(profile.gpu_weight / others)))


def _add_claim_binpack(entry: dict[str, Any], profile: SchedulerProfile) -> None:
    """GpuClaimBinpack beside NodeResourcesFit, with the profile's shape: it scores only pods
    whose ResourceClaims ask for GPUs, and hears of its placements at reserve."""
    score = entry["plugins"]["score"]
    score["enabled"] = [
        *score.get("enabled", []),
        {"name": CLAIM_BINPACK_PLUGIN, "weight": claim_binpack_weight(profile)},
    ]
    entry["plugins"] = {
        "preScore": {"enabled": [{"name": CLAIM_BINPACK_PLUGIN}]},
        **entry["plugins"],
        "reserve": {"enabled": [{"name": CLAIM_BINPACK_PLUGIN}]},
    }
    entry["pluginConfig"].append(
        {
            "name": CLAIM_BINPACK_PLUGIN,
            "args": {
                "shape": [{"utilization": p.utilization, "score": p.score} for p in profile.shape]
            },
        }
    )


def render_config_yaml(profile: SchedulerProfile, kubeconfig: str | None = None) -> str:
    """`render_config` as YAML: the file the ConfigMap holds and the scheduler reads."""
    return yaml.safe_dump(render_config(profile, kubeconfig), sort_keys=False)


# ------------------------------------------------------------------ Kubernetes objects
RBAC_API_GROUP = "rbac.authorization.k8s.io"
LEASE_API_GROUP = "coordination.k8s.io"
LEASE = "lease"
"""Suffix of the Role on the scheduler's own Lease and of its binding."""
SCHEDULER = "scheduler"
"""Suffix of the scheduler's ClusterRole and of its binding."""
AUTH_READER = "auth-reader"
"""Suffix of the binding to the Role delegated authentication reads its ConfigMap with."""
# Delegated authentication of the HTTPS endpoint reads a ConfigMap in kube-system, with the
# Role the API server keeps there for it.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/auth/authorizer/rbac/bootstrappolicy/namespace_policy.go
AUTH_READER_ROLE = "extension-apiserver-authentication-reader"
AUTH_READER_NAMESPACE = "kube-system"

# The verb sets of the bootstrap policy.
READ = ("get", "list", "watch")
READ_UPDATE = (*READ, "update", "patch")


def _rule(
    groups: tuple[str, ...], resources: tuple[str, ...], verbs: tuple[str, ...]
) -> dict[str, list[str]]:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


# What kube-scheduler v1.37 is granted by system:kube-scheduler and system:volume-scheduler with
# its default feature gates (the Deployment sets none), leaving out the Leases (create on any,
# get/update/list/watch on kube-scheduler's) and LeaseCandidates (CoordinatedLeaderElection,
# off by default): its own Lease is lease_role()'s. DRA is GA; DRAExtendedResource (claims
# created and deleted for extended resources), DRADeviceTaintRules and
# DRAResourceClaimGranularStatusAuthorization (resourceclaims/binding) are on by default in
# v1.37; GenericWorkload and CompositePodGroup (podgroups) are off, so left out. Older
# schedulers (v1.35, v1.36) need a subset.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/features/kube_features.go
SCHEDULER_RULES: tuple[dict[str, list[str]], ...] = (
    _rule(("", "events.k8s.io"), ("events",), ("create", "update", "patch")),
    # Fundamental resources; preemption deletes pods.
    _rule(("",), ("nodes",), READ),
    _rule(("",), ("pods",), (*READ, "delete")),
    _rule(("",), ("pods/binding", "bindings"), ("create",)),
    _rule(("",), ("pods/status",), ("patch", "update")),
    # What selects pods.
    _rule(("",), ("services", "replicationcontrollers"), READ),
    _rule(("apps", "extensions"), ("replicasets",), READ),
    _rule(("apps",), ("statefulsets",), READ),
    # What pods use or what applies to them; volume binding updates PVs and PVCs
    # (system:volume-scheduler).
    _rule(("policy",), ("poddisruptionbudgets",), READ),
    _rule(("",), ("persistentvolumeclaims", "persistentvolumes"), READ_UPDATE),
    _rule(("storage.k8s.io",), ("storageclasses",), READ),
    # Delegated authentication and authorization of the HTTPS endpoint (non-mutating).
    _rule(("authentication.k8s.io",), ("tokenreviews",), ("create",)),
    _rule(("authorization.k8s.io",), ("subjectaccessreviews",), ("create",)),
    # Volume limits and topology, namespaceSelector of pod affinity.
    _rule(("storage.k8s.io",), ("csinodes",), READ),
    _rule(("storage.k8s.io",), ("volumeattachments",), READ),
    _rule(("",), ("namespaces",), READ),
    _rule(("storage.k8s.io",), ("csidrivers",), READ),
    _rule(("storage.k8s.io",), ("csistoragecapacities",), READ),
    # Dynamic resource allocation.
    _rule(("resource.k8s.io",), ("deviceclasses",), READ),
    _rule(("resource.k8s.io",), ("resourceclaims",), READ_UPDATE),
    _rule(("resource.k8s.io",), ("resourceclaims/status",), READ_UPDATE),
    _rule(("",), ("pods/finalizers",), ("update",)),
    _rule(("resource.k8s.io",), ("resourceslices",), READ),
    _rule(("resource.k8s.io",), ("resourceclaims",), ("create", "delete")),
    _rule(("resource.k8s.io",), ("devicetaintrules",), READ),
    _rule(("resource.k8s.io",), ("resourceclaims/binding",), ("update", "patch")),
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


# What GenericWorkload adds to system:kube-scheduler: reading PodGroups, writing their status.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go
GANG_RULES: tuple[dict[str, list[str]], ...] = (
    _rule(("scheduling.k8s.io",), ("podgroups",), READ),
    _rule(("scheduling.k8s.io",), ("podgroups/status",), ("patch", "update")),
)


def scheduler_role(scheduler_name: str, gang_scheduling: bool = False) -> dict[str, Any]:
    """The scheduler's ClusterRole: SCHEDULER_RULES (and GANG_RULES with gangs), no Lease."""
    rules = [*SCHEDULER_RULES, *(GANG_RULES if gang_scheduling else ())]
    return {
        "apiVersion": f"{RBAC_API_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": object_meta(f"{scheduler_name}:{SCHEDULER}", scheduler_name, None),
        "rules": [dict(rule) for rule in rules],
    }


def lease_role(scheduler_name: str, lease_namespace: str) -> dict[str, Any]:
    """The Role on the scheduler's own Lease: get and update, on its name only (leader
    election reads and renews it; `lease` is created by the stack)."""
    return {
        "apiVersion": f"{RBAC_API_GROUP}/v1",
        "kind": "Role",
        "metadata": object_meta(f"{scheduler_name}:{LEASE}", scheduler_name, lease_namespace),
        "rules": [
            {
                "apiGroups": [LEASE_API_GROUP],
                "resources": ["leases"],
                "resourceNames": [scheduler_name],
                "verbs": ["get", "update"],
            }
        ],
    }


def lease(scheduler_name: str, lease_namespace: str) -> dict[str, Any]:
    """The Lease the scheduler elects its leader on, named after it. No spec: the holder's
    fields are the scheduler's to write (client-go's LeaseLock takes an empty one)."""
    return {
        "apiVersion": f"{LEASE_API_GROUP}/v1",
        "kind": "Lease",
        "metadata": object_meta(scheduler_name, scheduler_name, lease_namespace),
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
    """Every binding of the scheduler's ServiceAccount, by suffix: its ClusterRole
    (`scheduler_role`), the authentication reader's Role, the Role on its Lease
    (`lease_role`)."""
    roles = {
        SCHEDULER: ("ClusterRole", scheduler_role(scheduler_name)["metadata"]["name"], None),
        AUTH_READER: ("Role", AUTH_READER_ROLE, AUTH_READER_NAMESPACE),
        LEASE: (
            "Role",
            lease_role(scheduler_name, lease_namespace)["metadata"]["name"],
            lease_namespace,
        ),
    }
    return {
        suffix: role_binding(scheduler_name, namespace, suffix, role_ref(kind, role), where)
        for suffix, (kind, role, where) in roles.items()
    }


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
    feature_gates: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The Deployment: `replicas` pods of `image` reading `config_yaml` from the ConfigMap
    `config_map`, as the ServiceAccount `service_account`, spread over nodes, with
    `feature_gates` (SchedulerProfile.feature_gates)."""
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
                    container=scheduler_container(image, requests, feature_gates),
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


def feature_gates_flag(gates: Mapping[str, bool]) -> list[str]:
    """`--feature-gates=A=true,...` for `gates`, sorted; nothing for none."""
    if not gates:
        return []
    return [
        "--feature-gates=" + ",".join(f"{g}={str(v).lower()}" for g, v in sorted(gates.items()))
    ]


def scheduler_container(
    image: str, requests: Mapping[str, str], feature_gates: Mapping[str, bool] | None = None
) -> dict[str, Any]:
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
            *feature_gates_flag(feature_gates or {}),
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
