"""OpaGate's Kubernetes objects as data: gate data and settings in, plain dicts out.

One function per object (or per part two objects share): the native engines'
ValidatingAdmissionPolicy, MutatingAdmissionPolicy and their bindings; OPA's files, arguments,
Deployment, budget, Service and ValidatingWebhookConfiguration. OpaGate turns them into
resources; the live tests create the same objects on a real kube-apiserver, so nothing
renders a gate object twice. A value that is a Pulumi Output in the component (an object's
name, a checksum) is taken as `Any` and placed as given.

Every engine excludes kube-system and the gate's own namespace by name (the immutable
kubernetes.io/metadata.name label), so the gate can never stop the cluster from restarting
the gate itself, and no one who can label a namespace can take it out of the gate.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from components.gpu_resources import gated_names, gated_prefixes
from components.kubernetes_names import DAEMONSET_CONTROLLERS
from components.object_meta import PART_OF
from components.opa_gate.policies import gpu_scheduler_cel as cel
from components.opa_gate.settings import (
    DEFAULT_GATE_NAMESPACE,
    GATE_NAME,
    WEBHOOK_NAME,
    FailurePolicy,
)
from components.settings import PROJECT

if TYPE_CHECKING:
    from components.handoffs import OperatorPods

# Set by the API server on every namespace to the namespace's name; it cannot be changed.
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-metadata-name
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
OPA_PORT = 8443
# Built in, and usable outside kube-system since Kubernetes 1.17 (unless the cluster limits
# it with a ResourceQuota admission configuration); the class cluster add-ons run with.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/
OPA_PRIORITY_CLASS = "system-cluster-critical"
GATE_CONFIG_FILE = "gate.json"
# A mounted ConfigMap holds each key twice more, under the kubelet's `..data` link and its
# timestamped `..<date>` directory; loading those as well redeclares every rule and OPA
# refuses to start. Files named `..*` are skipped.
# Ref: https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically
CONFIGMAP_INTERNALS = "..*"
# Labels of every object the gate creates.
GATE_LABELS = {
    "app.kubernetes.io/name": "gpu-scheduler-gate",
    **PART_OF,
}
# OPA's pods, as its Deployment, budget and Service select them.
OPA_SELECTOR = {"app.kubernetes.io/name": "opa"}
# Names of OPA's objects in the gate's namespace (Deployment, budget and Service are "opa").
OPA_NAME = "opa"
OPA_SERVING_SECRET = "opa-serving"
OPA_POLICIES_CONFIGMAP = "opa-policies"
GATE_CONFIGMAP = "gpu-gate-config"
# How lists are written in the parameter document (no resource or user name holds a comma).
LIST_SEPARATOR = ","
# The parameter document's key for the DeviceClasses whose claims are GPU requests (DRA mode).
DEVICE_CLASSES_KEY = cel.DEVICE_CLASSES_KEY
# The parameter document's keys for the stack's PriorityClasses and the namespaces whose pods
# may name them without asking for a GPU.
PRIORITY_CLASSES_KEY = "priority_classes"
# The parameter document's key for the namespaces whose PodGroups the stack's scheduler places.
GANG_NAMESPACES_KEY = "gang_namespaces"
PRIORITY_CLASS_NAMESPACES_KEY = "priority_class_namespaces"
# The parameter document's keys for the GPU pool's nodes and where pods that ask for no GPU may
# run on them: namespaces, and DaemonSets as namespace/name.
POOL_NODES_KEY = "pool_nodes"
POOL_NAMESPACES_KEY = "pool_namespaces"
POOL_DAEMONSETS_KEY = "pool_daemonsets"
# What a pod's resource claims name, resource.k8s.io/v1 (GA since Kubernetes 1.34): the param
# kind of each claim policy pair. Built in, like ConfigMap, so always mapped.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/
CLAIM_API_VERSION = "resource.k8s.io/v1"
CLAIM_KINDS = cel.CLAIM_KINDS


# --------------------------------------------------------------------------- gate data


def gate_data(
    scheduler_name: str,
    resources: Sequence[str],
    prefixes: Sequence[str],
    *,
    operator_pods: OperatorPods | None = None,
    pool_toleration: Mapping[str, str] | None = None,
    pool_nodes: Sequence[str] = (),
    pool_namespaces: Sequence[str] = (),
    pool_daemonsets: Sequence[str] = (),
    gang_pods: bool = False,
    gang_namespaces: Sequence[str] = (),
    device_classes: Sequence[str] = (),
    priority_classes: Sequence[str] = (),
    priority_class_namespaces: Sequence[str] = (),
) -> dict[str, str]:
    """The gate's one parameter document (components/opa_gate/policies/README.md, "Data contract"): string keys
    and values, written into the native policies (their `config` variable), and the JSON OPA
    reads as data.gpu_cluster.config. Lists are comma-separated.

    Every GPU (components/gpu_resources.py) is gated whatever `resources` and `prefixes` add;
    `operator_pods` (the GPU Operator's own pods) are left out when None. `pool_toleration`
    (TaintedGpuPool's, which names the pool's taint exactly) makes the pods that tolerate the
    pool's taint `pool_pods`, kept on the scheduler like GPU pods; none when None. With it, a
    pod that asks for no GPU is kept off the pool (`pool_nodes`, TaintedGpuPool's nodes: bound
    to one, or tolerating the taint) unless it is in `pool_namespaces` or a pod of one of
    `pool_daemonsets` (namespace/name); in those namespaces the pods that tolerate the taint
    are the pool pods.
    `gang_pods` (the stack's scheduler places gangs) keeps every pod of a PodGroup on it too,
    only in `gang_namespaces` when given (scheduler.gangNamespaces; empty: every namespace).
    `device_classes` (DRA mode: GpuOperatorSettings.device_classes()) are the DeviceClasses
    whose resource claims are GPU requests, judged by the claim policies
    (claim_policy_spec()); without them every claim counts as a GPU request.
    `priority_classes` (GpuPriorityClasses' class names, when the layer is on) may be named
    only by pods that ask for a GPU, or by pods in `priority_class_namespaces`; without them
    no PriorityClass is judged (and the namespaces are left out).
    """
    data = {
        "scheduler_name": scheduler_name,
        "gpu_resources": LIST_SEPARATOR.join(gated_names(resources)),
        "gpu_resource_prefixes": LIST_SEPARATOR.join(gated_prefixes(prefixes)),
    }
    if operator_pods is not None:
        data["operator_pods.namespace"] = operator_pods.namespace
        data["operator_pods.creators"] = LIST_SEPARATOR.join(sorted(operator_pods.creators))
        data["operator_pods.daemonset_controllers"] = LIST_SEPARATOR.join(
            sorted(operator_pods.daemonset_controllers)
        )
    if pool_toleration is not None:
        for key in ("key", "value", "effect"):
            data[f"pool_pods.taint.{key}"] = pool_toleration.get(key, "")
        data["pool_pods.daemonset_controllers"] = LIST_SEPARATOR.join(sorted(DAEMONSET_CONTROLLERS))
        for key, names in (
            (POOL_NODES_KEY, pool_nodes),
            (POOL_NAMESPACES_KEY, pool_namespaces),
            (POOL_DAEMONSETS_KEY, pool_daemonsets),
        ):
            if names:
                data[key] = LIST_SEPARATOR.join(sorted(set(names)))
    if gang_pods:  # only when on: a stack without gangs keeps its document as it was
        data["gang_pods"] = "true"
        if gang_namespaces:
            data[GANG_NAMESPACES_KEY] = LIST_SEPARATOR.join(sorted(set(gang_namespaces)))
    if device_classes:  # DRA mode only: a device-plugin stack keeps its document as it was
        data[DEVICE_CLASSES_KEY] = LIST_SEPARATOR.join(sorted(set(device_classes)))
    if priority_classes:  # layer 8 only: a stack without it keeps its document as it was
        data[PRIORITY_CLASSES_KEY] = LIST_SEPARATOR.join(sorted(set(priority_classes)))
        if priority_class_namespaces:
            data[PRIORITY_CLASS_NAMESPACES_KEY] = LIST_SEPARATOR.join(
                sorted(set(priority_class_namespaces))
            )
    return data


def claims_looked_up(params: Mapping[str, str]) -> bool:
    """Whether the parameter document is DRA mode's: resource claims are GPU requests only
    when what they name selects one of its device classes (the claim policies judge them)."""
    return cel.claims_looked_up(params)


def gate_list(params: Mapping[str, str], key: str) -> list[str]:
    """The list under `key` of a parameter document ([] when absent or empty)."""
    value = params.get(key, "")
    return value.split(LIST_SEPARATOR) if value else []


def gate_metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    """Metadata of a gate object: its name, its namespace unless cluster-scoped, GATE_LABELS."""
    if namespace is None:
        return {"name": name, "labels": dict(GATE_LABELS)}
    return {"name": name, "namespace": namespace, "labels": dict(GATE_LABELS)}


# --------------------------------------------------------------------------- what is judged


def excluded_namespaces(gate_namespace: str, *others: str) -> list[str]:
    """The namespaces neither engine judges: kube-system and the gate's own (and `others`)."""
    return sorted({"kube-system", gate_namespace, *others})


def namespace_selector(gate_namespace: str, *others: str) -> dict[str, Any]:
    """Namespace selector of both engines: every namespace but excluded_namespaces(), by name.

    A selector on a label anyone may set (such as openpolicyagent.org/webhook=ignore) lets
    whoever can create or label a namespace bypass the gate; the name label cannot be set.
    """
    return {
        "matchExpressions": [
            {
                "key": NAMESPACE_NAME_LABEL,
                "operator": "NotIn",
                "values": excluded_namespaces(gate_namespace, *others),
            }
        ]
    }


def pod_create_rule() -> dict[str, Any]:
    """A pod CREATE (core v1): what every engine judges, and all the routing policy mutates."""
    return {
        "operations": ["CREATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
    }


def ephemeral_containers_rule() -> dict[str, Any]:
    """An UPDATE of a pod's ephemeralcontainers subresource: how `kubectl debug` adds a
    container, NVIDIA_VISIBLE_DEVICES and all, to a running pod. The request's object is the
    whole Pod (oldObject the pod before), which the engines judge as they judge a CREATE.
    Ref: https://kubernetes.io/docs/concepts/workloads/pods/ephemeral-containers/
    """
    return {
        "operations": ["UPDATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods/ephemeralcontainers"],
    }


def pod_update_rule() -> dict[str, Any]:
    """An UPDATE of a pod itself (core v1): a pod's tolerations may grow after creation, and a
    Pending pod is placed again with them, onto the GPU pool if one tolerates its taint.
    Ref: https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement
    """
    return {
        "operations": ["UPDATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
    }


def judged_rules() -> list[dict[str, Any]]:
    """The requests the refusing side of every engine judges: a pod CREATE, an UPDATE of a pod
    (only the tolerations it adds) and an UPDATE of pods/ephemeralcontainers (only
    NVIDIA_VISIBLE_DEVICES in the containers it adds)."""
    return [pod_create_rule(), pod_update_rule(), ephemeral_containers_rule()]


def policy_match_constraints(
    gate_namespace: str, rules: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """matchConstraints of a native policy: `rules` (default judged_rules()) outside
    excluded_namespaces()."""
    return {
        "namespaceSelector": namespace_selector(gate_namespace),
        "resourceRules": [dict(r) for r in (judged_rules() if rules is None else rules)],
    }


def webhook_condition(config: Mapping[str, str]) -> str:
    """CEL, the webhook's match condition, for the parameter document `config` (gate_data()):
    a GPU request of a pod being created, a pool pod, or NVIDIA_VISIBLE_DEVICES in a container
    the request brings (a new pod's, or an ephemeral container being added), from a pod the
    policy judges (not a mirror pod, not the GPU Operator's own: the device plugin's pods set
    the variable). Other requests never reach OPA, so an OPA outage cannot hold them back.

    A webhook's match conditions have no variables, so this is the static condition of
    components/opa_gate/policies/gpu_scheduler.cel.yaml with its variables inlined, the document OPA reads written
    in (cel.webhook_conditions()).
    Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go
    """
    (condition,) = cel.webhook_conditions(config)
    return condition["expression"]


# --------------------------------------------------------------------------- native engines


def admission_policy_spec(
    params: Mapping[str, str],
    failure_policy: FailurePolicy = "Fail",
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: components/opa_gate/policies/gpu_scheduler.rego's rules and messages in CEL
    (components/opa_gate/policies/gpu_scheduler.cel.yaml), the parameter document `params` (gate_data()) written
    in. No parameter object: nothing in the cluster that a tenant, or anyone who can write in
    the gate's namespace, could edit or delete stands between the cluster and the rules, and
    no informer has to sync before a pod can be admitted. In DRA mode (the document has
    device classes) resource claims are left to claim_policy_spec().
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/
    """
    return {
        "failurePolicy": failure_policy,
        "matchConstraints": policy_match_constraints(gate_namespace),
        "variables": cel.variables(params),
        "validations": cel.validations(),
    }


def admission_policy_binding_spec(
    policy_name: Any = GATE_NAME, *, gate_namespace: str = DEFAULT_GATE_NAMESPACE
) -> dict[str, Any]:
    """The binding: enforce (Deny) everywhere but in excluded_namespaces()."""
    return {
        "policyName": policy_name,
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": namespace_selector(gate_namespace)},
    }


def routing_policy_spec(
    params: Mapping[str, str],
    failure_policy: FailurePolicy = "Fail",
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The MutatingAdmissionPolicy that routes GPU pods and pool pods to the stack's scheduler
    (components/opa_gate/policies/gpu_scheduler.cel.yaml, `routing`), the parameter document `params` written in.

    A pod CREATE that asks for a gated GPU resource, or a pool pod, and leaves
    spec.schedulerName unset (the API server has filled in default-scheduler by then) gets the
    stack's scheduler; a GPU pod headed there also gets the pool's toleration (the parameter
    document's pool taint, operator Equal) unless one of its tolerations already covers the
    taint. A pod with another scheduler is left as it is (the ValidatingAdmissionPolicy
    refuses it), and so is a pod created bound to a node. In DRA mode resource claims are left
    to claim_routing_policy_spec().
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/mutating-admission-policy/
    """
    return {
        "failurePolicy": failure_policy,
        "reinvocationPolicy": "IfNeeded",
        # Pod creations only: nothing routes a running pod.
        "matchConstraints": policy_match_constraints(gate_namespace, [pod_create_rule()]),
        "matchConditions": cel.routing_conditions(params),
        "variables": cel.routing_variables(params),
        "mutations": [
            {"patchType": "JSONPatch", "jsonPatch": {"expression": e}}
            for e in cel.routing_mutations()
        ],
    }


def routing_binding_spec(
    policy_name: Any = GATE_NAME, *, gate_namespace: str = DEFAULT_GATE_NAMESPACE
) -> dict[str, Any]:
    """The MutatingAdmissionPolicyBinding: route everywhere but in excluded_namespaces()."""
    return {
        "policyName": policy_name,
        "matchResources": {"namespaceSelector": namespace_selector(gate_namespace)},
    }


def written_document(spec: Mapping[str, Any]) -> dict[str, str]:
    """The parameter document a native policy's spec was rendered with."""
    return cel.document(spec["variables"])


# --------------------------------------------------------------------------- native: claims


def claim_policy_name(kind: str) -> str:
    """Name of the claim policies for `kind` (cel.CLAIM_KINDS) and of their bindings."""
    return f"{GATE_NAME}-{kind.lower()}s"


def claim_param_kind(kind: str) -> dict[str, str]:
    """The claim policies' paramKind: the looked-up `kind` of resource.k8s.io/v1."""
    if kind not in cel.CLAIM_KINDS:
        raise ValueError(f"claim kind {kind!r} is not one of {list(cel.CLAIM_KINDS)}")
    return {"apiVersion": CLAIM_API_VERSION, "kind": kind}


def claim_param_ref() -> dict[str, Any]:
    """A claim binding's paramRef: every object of the policy's kind in the pod's own namespace
    (no namespace: the request's; an empty selector selects all), so the API server evaluates
    the policy once per object, from its informer's cache.

    None of them (a namespace without templates or claims) skips the binding (`Allow`): with
    `Deny` every pod of such a namespace, CPU pods included, would be refused. A pod that names
    an object the cache does not hold yet (created before its template or claim, or within the
    moment the cache takes to see a new one) is therefore judged without that claim, as a pod
    that does not ask for it (components/opa_gate/policies/README.md, "DRA claims").
    Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/generic/policy_dispatcher.go
    """
    return {"selector": {}, "parameterNotFoundAction": "Allow"}


# The claim policies' failure policy, whatever admission.failurePolicy says. Until the API
# server's informer of their paramKind has synced (after every API server start) each
# evaluation fails, and with Fail every pod CREATE the policies match, CPU pods included, would
# be refused for that time. Ignored instead, a GPU claim pod admitted in that window may reach
# another scheduler, where the allocation policy (no parameter, Fail) keeps it from any GPU.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/generic/policy_dispatcher.go
CLAIM_FAILURE_POLICY: FailurePolicy = "Ignore"


def claim_policy_spec(
    kind: str,
    params: Mapping[str, str],
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy that refuses a pod off the scheduler whose resource claim
    names a `kind` object selecting a GPU DeviceClass (DRA mode): the GPU pod validations of
    components/opa_gate/policies/gpu_scheduler.cel.yaml, once per object the pod names.

    Its `params` is that object; the parameter document `params` (gate_data(), with its
    device classes) is written in, as in every native policy. CLAIM_FAILURE_POLICY.
    """
    return {
        "failurePolicy": CLAIM_FAILURE_POLICY,
        "paramKind": claim_param_kind(kind),
        "matchConstraints": policy_match_constraints(gate_namespace, [pod_create_rule()]),
        "matchConditions": cel.claim_conditions(kind, params),
        "variables": cel.claim_variables(kind, params),
        "validations": cel.claim_validations(),
    }


def claim_routing_policy_spec(
    kind: str,
    params: Mapping[str, str],
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The MutatingAdmissionPolicy that routes a pod whose resource claim names a `kind`
    object selecting a GPU DeviceClass, as routing_policy_spec() routes a GPU pod (scheduler,
    pool toleration); the parameter document `params` written in, as in claim_policy_spec()."""
    return {
        "failurePolicy": CLAIM_FAILURE_POLICY,
        "paramKind": claim_param_kind(kind),
        "reinvocationPolicy": "IfNeeded",
        "matchConstraints": policy_match_constraints(gate_namespace, [pod_create_rule()]),
        "matchConditions": cel.claim_routing_conditions(kind, params),
        "variables": cel.claim_routing_variables(kind, params),
        "mutations": [
            {"patchType": "JSONPatch", "jsonPatch": {"expression": e}}
            for e in cel.routing_mutations()
        ],
    }


def claim_binding_spec(
    policy_name: Any, *, gate_namespace: str = DEFAULT_GATE_NAMESPACE
) -> dict[str, Any]:
    """A claim ValidatingAdmissionPolicyBinding: enforce everywhere but in
    excluded_namespaces(), each object of the kind in the pod's namespace a parameter."""
    return {
        "policyName": policy_name,
        "paramRef": claim_param_ref(),
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": namespace_selector(gate_namespace)},
    }


def claim_routing_binding_spec(
    policy_name: Any, *, gate_namespace: str = DEFAULT_GATE_NAMESPACE
) -> dict[str, Any]:
    """A claim MutatingAdmissionPolicyBinding, as claim_binding_spec()."""
    return {
        "policyName": policy_name,
        "paramRef": claim_param_ref(),
        "matchResources": {"namespaceSelector": namespace_selector(gate_namespace)},
    }


# --------------------------------------------------------------------------- native: allocations

# The allocation policy and its binding (DRA mode).
ALLOCATION_POLICY = f"{GATE_NAME}-allocations"


def allocation_rule() -> dict[str, Any]:
    """The write that allocates devices to a claim: an UPDATE of resourceclaims/status (a
    claim is created without status). resource.k8s.io/v1; a write in an older served version
    is judged converted to it (matchPolicy Equivalent)."""
    return {
        "operations": ["UPDATE"],
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "resources": ["resourceclaims/status"],
    }


def allocation_policy_spec(
    *,
    allocator: str,
    scheduler_name: str,
    drivers: Sequence[str],
    failure_policy: FailurePolicy = "Fail",
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    operator_namespace: str = "",
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy that lets only `allocator` (the stack's scheduler's
    username) allocate a device of a GPU driver (`drivers`) that is not admin access
    (components/opa_gate/policies/gpu_scheduler.cel.yaml, `allocations`). No parameter: everything it reads is
    written in, so no object in the cluster opens it.

    It judges every namespace but excluded_namespaces() and the GPU Operator's
    (`operator_namespace`), whose own workloads the cluster's scheduler places.
    """
    return {
        "failurePolicy": failure_policy,
        "matchConstraints": {
            "matchPolicy": "Equivalent",
            "namespaceSelector": allocation_namespace_selector(gate_namespace, operator_namespace),
            "resourceRules": [allocation_rule()],
        },
        "variables": cel.allocation_variables(
            allocator=allocator, scheduler_name=scheduler_name, drivers=drivers
        ),
        "validations": cel.allocation_validations(),
    }


def allocation_namespace_selector(gate_namespace: str, operator_namespace: str) -> dict[str, Any]:
    """Where the allocation policy judges: every namespace but excluded_namespaces() and the
    GPU Operator's, by name."""
    return namespace_selector(gate_namespace, *([operator_namespace] if operator_namespace else []))


def allocation_binding_spec(
    policy_name: Any = ALLOCATION_POLICY,
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    operator_namespace: str = "",
) -> dict[str, Any]:
    """The allocation policy's binding: enforce (Deny), no parameter."""
    return {
        "policyName": policy_name,
        "validationActions": ["Deny"],
        "matchResources": {
            "namespaceSelector": allocation_namespace_selector(gate_namespace, operator_namespace)
        },
    }


# --------------------------------------------------------------------------- native: all objects

NativeObject = tuple[str, str, dict[str, Any]]
"""(collection under admissionregistration.k8s.io/v1, name, spec) of one native gate object."""


def native_objects(
    params: Mapping[str, str],
    *,
    routing: bool,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    failure_policy: FailurePolicy = "Fail",
) -> list[NativeObject]:
    """Every object a native engine registers for the parameter document `params` (the
    routing engine with `routing`), policies before their bindings, from the builders above,
    as OpaGate declares them; in DRA mode (claims_looked_up()) the claim policies too. The
    allocation policy, which needs the scheduler's identity, is allocation_objects(). For
    whatever creates the gate without Pulumi: the live tests and the benchmarks."""
    ns = gate_namespace
    objects: list[NativeObject] = [
        (
            "validatingadmissionpolicies",
            GATE_NAME,
            admission_policy_spec(params, failure_policy, gate_namespace=ns),
        ),
        (
            "validatingadmissionpolicybindings",
            GATE_NAME,
            admission_policy_binding_spec(gate_namespace=ns),
        ),
    ]
    if routing:
        objects += [
            (
                "mutatingadmissionpolicies",
                GATE_NAME,
                routing_policy_spec(params, failure_policy, gate_namespace=ns),
            ),
            ("mutatingadmissionpolicybindings", GATE_NAME, routing_binding_spec(gate_namespace=ns)),
        ]
    for kind in CLAIM_KINDS if claims_looked_up(params) else ():
        name = claim_policy_name(kind)
        objects += [
            (
                "validatingadmissionpolicies",
                name,
                claim_policy_spec(kind, params, gate_namespace=ns),
            ),
            (
                "validatingadmissionpolicybindings",
                name,
                claim_binding_spec(name, gate_namespace=ns),
            ),
        ]
        if routing:
            objects += [
                (
                    "mutatingadmissionpolicies",
                    name,
                    claim_routing_policy_spec(kind, params, gate_namespace=ns),
                ),
                (
                    "mutatingadmissionpolicybindings",
                    name,
                    claim_routing_binding_spec(name, gate_namespace=ns),
                ),
            ]
    return objects


def allocation_objects(
    *,
    allocator: str,
    scheduler_name: str,
    drivers: Sequence[str],
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    operator_namespace: str = "",
) -> list[NativeObject]:
    """The allocation policy and its binding (DRA mode), as native_objects() lists objects."""
    return [
        (
            "validatingadmissionpolicies",
            ALLOCATION_POLICY,
            allocation_policy_spec(
                allocator=allocator,
                scheduler_name=scheduler_name,
                drivers=drivers,
                gate_namespace=gate_namespace,
                operator_namespace=operator_namespace,
            ),
        ),
        (
            "validatingadmissionpolicybindings",
            ALLOCATION_POLICY,
            allocation_binding_spec(
                gate_namespace=gate_namespace, operator_namespace=operator_namespace
            ),
        ),
    ]


# --------------------------------------------------------------------------- engine opa: files


def policy_files(policies: Mapping[str, str]) -> dict[str, str]:
    """{file name: Rego source} of the one ConfigMap OPA loads at start-up: every policy."""
    return {f"{stem}.rego": source for stem, source in sorted(policies.items())}


def gate_config_json(config: Mapping[str, Any]) -> str:
    """The gate data as OPA reads it from GATE_CONFIG_FILE: JSON, keys sorted."""
    return json.dumps(config, sort_keys=True)


def inputs_checksum(cert_pem: str, config: Mapping[str, Any], files: Mapping[str, str]) -> str:
    """SHA-256 of everything OPA reads at start-up: serving certificate, gate data, policies.

    OPA reads its files once, so a new value rolls the Deployment (a pod template annotation).
    """
    return hashlib.sha256(
        json.dumps([cert_pem, config, files], sort_keys=True).encode()
    ).hexdigest()


def serving_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server calls OPA's Service by: its serving certificate's names."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def opa_run_args(
    *,
    https_addr: str = f"0.0.0.0:{OPA_PORT}",
    certs_dir: str = "/certs",
    policy_dir: str = "/policies",
    config_dir: str = "/config",
) -> list[str]:
    """`opa` arguments: HTTPS for the API server, policies and data read once at start.

    The directories hold the serving Secret (tls.crt, tls.key), policy_files() and the gate
    data (gate.json). They are not watched: a change of any of them changes the pod
    template's checksum, so the Deployment rolls out OPA pods that read the new files, one
    readiness-checked replica at a time, rather than each replica reloading on its own.
    Authorization (components/opa_gate/policies/authz.rego) leaves anonymous callers, the API server and the
    kubelet, the webhook decision and /health only; there is no management API to protect.
    """
    return [
        "run",
        "--server",
        f"--addr=https://{https_addr}",
        f"--tls-cert-file={certs_dir}/tls.crt",
        f"--tls-private-key-file={certs_dir}/tls.key",
        "--authorization=basic",
        "--skip-version-check",
        "--log-format=json",
        f"--ignore={CONFIGMAP_INTERNALS}",
        policy_dir,
        f"gpu_cluster.config:{config_dir}/{GATE_CONFIG_FILE}",
    ]


# --------------------------------------------------------------------------- engine opa: pods


def opa_affinity(selector: Mapping[str, str]) -> dict[str, Any]:
    """OPA replicas on different nodes where the cluster has them.

    Preferred, not required: with required anti-affinity a cluster with fewer schedulable
    nodes than replicas (or a rolling update's surge pod) leaves a replica Pending for good.
    """
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": dict(selector)},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }


def opa_container(image: str) -> dict[str, Any]:
    """OPA's one container: opa_run_args(), probed over HTTPS, read-only, no privileges."""
    https = {"scheme": "HTTPS", "port": OPA_PORT}
    return {
        "name": "opa",
        "image": image,
        "args": opa_run_args(),
        "ports": [{"name": "https", "containerPort": OPA_PORT}],
        "readinessProbe": {"httpGet": {**https, "path": "/health/ready"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {**https, "path": "/health/live"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "certs", "mountPath": "/certs", "readOnly": True},
            {"name": "policies", "mountPath": "/policies", "readOnly": True},
            {"name": "config", "mountPath": "/config", "readOnly": True},
        ],
    }


def opa_pod_spec(
    image: str,
    *,
    service_account: Any = OPA_NAME,
    serving_secret: Any = OPA_SERVING_SECRET,
    policies_configmap: Any = OPA_POLICIES_CONFIGMAP,
    config_configmap: Any = GATE_CONFIGMAP,
) -> dict[str, Any]:
    """OPA's pod: its own identity without API access, ahead of ordinary workloads, its files
    mounted from the serving Secret and the two ConfigMaps (names as given)."""
    return {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,
        # Scheduled, and kept, ahead of ordinary workloads: GPU pods wait on it.
        "priorityClassName": OPA_PRIORITY_CLASS,
        "affinity": opa_affinity(OPA_SELECTOR),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [opa_container(image)],
        "volumes": [
            {"name": "certs", "secret": {"secretName": serving_secret}},
            {"name": "policies", "configMap": {"name": policies_configmap}},
            {"name": "config", "configMap": {"name": config_configmap}},
        ],
    }


def opa_deployment_spec(
    replicas: int, pod_spec: Mapping[str, Any], inputs_sha256: Any
) -> dict[str, Any]:
    """OPA's Deployment: `replicas` of `pod_spec`, rolled when inputs_checksum() changes."""
    return {
        "replicas": replicas,
        "selector": {"matchLabels": dict(OPA_SELECTOR)},
        "template": {
            "metadata": {
                "labels": {**GATE_LABELS, **OPA_SELECTOR},
                # OPA reads its files once: new certificates, policies or config roll the
                # Deployment.
                "annotations": {f"{PROJECT}.io/inputs-sha256": inputs_sha256},
            },
            "spec": dict(pod_spec),
        },
    }


def opa_disruption_budget(replicas: int, selector: Mapping[str, str]) -> dict[str, Any] | None:
    """The PodDisruptionBudget spec for OPA: one replica always up; none for a single replica.

    With one replica a budget could only forbid every eviction (maxUnavailable 0), which
    blocks node drains until someone deletes it; a single replica is a choice to accept
    a short outage of GPU pod admission while it moves instead.
    Unhealthy replicas may always be evicted, so a broken pod never blocks a drain.
    Ref: https://kubernetes.io/docs/tasks/run-application/configure-pdb/#unhealthy-pod-eviction-policy
    """
    if replicas <= 1:
        return None
    return {
        "minAvailable": 1,
        "selector": {"matchLabels": dict(selector)},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def opa_service_spec() -> dict[str, Any]:
    """OPA's Service: port 443, where the webhook calls, to OPA's HTTPS port."""
    return {
        "selector": dict(OPA_SELECTOR),
        "ports": [{"name": "https", "port": 443, "targetPort": OPA_PORT}],
    }


# --------------------------------------------------------------------------- engine opa: webhook


def webhook_client_config(ca_pem: str, namespace: str, service: str) -> dict[str, Any]:
    """How the API server calls OPA: its Service at path `/`, trusting the gate's CA."""
    return {
        "caBundle": base64.b64encode(ca_pem.encode()).decode(),
        "service": {"namespace": namespace, "name": service, "path": "/", "port": 443},
    }


def webhook_spec(
    *,
    config: Mapping[str, Any],
    client_config: Mapping[str, Any],
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration's one webhook; OPA answers at path `/`.

    `config` is gate_data(): only pod CREATEs that ask for one of its GPU resources, tolerate
    the GPU pool's taint or mention NVIDIA_VISIBLE_DEVICES, and ephemeral containers added with
    the variable, are sent (judged_rules() and matchConditions, GA since 1.30); with
    failurePolicy Fail an OPA outage then holds back those requests only.
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-matchconditions
    """
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        # Also makes the API server call the gate for dry-run requests.
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "matchPolicy": "Equivalent",
        "namespaceSelector": namespace_selector(gate_namespace),
        "rules": [{**rule, "scope": "Namespaced"} for rule in judged_rules()],
        "matchConditions": [{"name": "gpu-pod", "expression": webhook_condition(config)}],
        "clientConfig": dict(client_config),
    }
