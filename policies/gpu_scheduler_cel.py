"""gpu_scheduler.rego's rules in CEL, for the native engines (beside the Rego they mirror).

components/opa_gate/manifests.py wraps these expressions into the ValidatingAdmissionPolicy,
the MutatingAdmissionPolicy that routes GPU pods, and the webhook's match condition; the gate
data (gate_data(): scheduler name, gated resource names and prefixes, the GPU Operator's own
pods) is written in as literals. policies/samples.yaml holds the sample pods both
engines must judge alike (tests/integration/test_opa_gate_live.py runs them).

Rule by rule, against policies/gpu_scheduler.rego:
- `new_containers` -> NEW_CONTAINERS: every container of a pod CREATE; the ephemeral
  containers an UPDATE of pods/ephemeralcontainers adds.
- `requested_gpu_resources` -> gpu_requests_by_container(), CLAIM_NAMES / requests_gpu(): on a
  pod CREATE, a gated resource asked for (requests or limits) by any container, initContainer
  or ephemeralContainer, quantity above zero; and each DRA claim in spec.resourceClaims.
- `mirror_pod` -> MIRROR_POD, `operator_pod` -> operator_pod(), `exempt` -> variable exempt.
- `unrequested_visible_devices` -> unrequested_visible_devices(): new containers that set
  NVIDIA_VISIBLE_DEVICES (not to void or none) and request no GPU themselves.
- `deny` (not on the scheduler) -> the first of validations().
- `deny` (spec.nodeName preset) -> the second of validations().
- `deny` (NVIDIA_VISIBLE_DEVICES without a GPU) -> the third of validations().
- `tolerates_pool_taint`, `pool_daemonset_pod`, `pool_pod` -> toleration_matches(keyed=True),
  daemonset_pod(), pool_pod(): a pod being created, not bound to a node, with a toleration that
  names the GPU pool taint's key and tolerates it, not the DaemonSet controller's.
- `deny` (a pool pod off the scheduler) -> the fourth of validations().
- Routing has no Rego twin: OPA is a validating webhook and only refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# What kube-apiserver fills in for a pod that leaves spec.schedulerName unset.
DEFAULT_SCHEDULER = "default-scheduler"

# The request creates a pod; otherwise it is an UPDATE of pods/ephemeralcontainers (the only
# other request the validating engines match).
CREATING = "request.operation == 'CREATE'"
# An ephemeral container `c` the pod had before this request (they cannot be changed or removed).
_EPHEMERAL_BEFORE = (
    "(oldObject != null && has(oldObject.spec.ephemeralContainers)"
    " && oldObject.spec.ephemeralContainers.exists(o, o.name == c.name))"
)
# The containers the request brings: every container of a pod it creates; the ephemeral
# containers an UPDATE of pods/ephemeralcontainers adds (`kubectl debug`).
NEW_CONTAINERS = (
    f"({CREATING} ? object.spec.containers"
    " + (has(object.spec.initContainers) ? object.spec.initContainers : []) : [])"
    " + (has(object.spec.ephemeralContainers)"
    f" ? object.spec.ephemeralContainers.filter(c, {CREATING} || !{_EPHEMERAL_BEFORE}) : [])"
)

# The smallest string of a non-empty list L (no sort() in the API server's CEL).
_SMALLEST = "{l}.filter(x, {l}.all(y, x <= y))[0]"


def literal(value: str | Sequence[str]) -> str:
    """A string or list of strings as a CEL literal (JSON's are valid CEL)."""
    return json.dumps(value if isinstance(value, str) else list(value))


def gate_lists(config: Mapping[str, Any]) -> tuple[str, str]:
    """The gated resource names and prefixes of the gate data, as CEL list literals."""
    prefixes = [p for p in config["gpu_resource_prefixes"] if p]
    return literal(config["gpu_resources"]), literal(prefixes)


def _gpu_names(section: str, resources: str, prefixes: str) -> str:
    """The GPU resources container `c` asks for in `section`, quantity above zero."""
    return (
        f"(has(c.resources.{section}) ? c.resources.{section}.filter(r,"
        f" (r in {resources} || {prefixes}.exists(p, r.startsWith(p)))"
        f" && quantity(string(c.resources.{section}[r])).isGreaterThan(quantity('0'))) : [])"
    )


def container_requests_gpu(resources: str, prefixes: str) -> str:
    """True when container `c` itself asks for a GPU: a gated resource, or a DRA claim."""
    return (
        "(has(c.resources) && ((has(c.resources.claims) && size(c.resources.claims) > 0)"
        f" || size({_gpu_names('requests', resources, prefixes)}"
        f" + {_gpu_names('limits', resources, prefixes)}) > 0))"
    )


def gpu_requests_by_container(containers: str, resources: str, prefixes: str) -> str:
    """For each of `containers`, the GPU resources (`resources`, `prefixes`) it asks for."""
    return (
        f"{containers}.map(c, !has(c.resources) ? [] : "
        + _gpu_names("requests", resources, prefixes)
        + " + "
        + _gpu_names("limits", resources, prefixes)
        + ")"
    )


# Devices asked for through DRA: each pod-level claim (a ResourceClaim or a template of one),
# named as the Rego policy names it. Every claim counts: its device class is in another object.
CLAIM_NAMES = (
    "has(object.spec.resourceClaims) ? object.spec.resourceClaims.map(c, 'resource claim '"
    " + (has(c.name) && c.name != '' ? c.name : '<unnamed>')) : []"
)
HAS_CLAIMS = "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0"


def requests_gpu(config: Mapping[str, Any]) -> str:
    """True when a pod being created asks for a gated GPU resource or a DRA claim; usable
    without variables (a match condition), with the gate data written in."""
    resources, prefixes = gate_lists(config)
    by_container = gpu_requests_by_container(f"({NEW_CONTAINERS})", resources, prefixes)
    return f"{CREATING} && ({by_container}.exists(l, size(l) > 0) || ({HAS_CLAIMS}))"


# --------------------------------------------------------------------------- no GPU unrequested

# With the NVIDIA container toolkit's default (accept-nvidia-visible-devices-envvar-when-
# unprivileged = true) a container that sets this reaches the GPUs it names, `all` of them,
# whatever it requested; void, none and empty give it none.
# Ref: https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/cmd/nvidia-ctk-installer/toolkit/toolkit.go
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICE_VALUES = ("", "none", "void")

# Container `c` sets the variable to something that can name a device: a value other than
# NO_DEVICE_VALUES, or one taken from elsewhere (valueFrom), unknown at admission.
SETS_VISIBLE_DEVICES = (
    f"has(c.env) && c.env.exists(e, e.name == {literal(VISIBLE_DEVICES)}"
    f" && (has(e.valueFrom) || (has(e.value) && !(e.value in {literal(NO_DEVICE_VALUES)}))))"
)
# Some container the request brings mentions the variable at all (the webhook sends those to
# OPA).
MENTIONS_VISIBLE_DEVICES = (
    f"({NEW_CONTAINERS}).exists(c, has(c.env)"
    f" && c.env.exists(e, e.name == {literal(VISIBLE_DEVICES)}))"
)


def unrequested_visible_devices(containers: str, resources: str, prefixes: str) -> str:
    """Names of `containers` that set NVIDIA_VISIBLE_DEVICES and request no GPU themselves."""
    return (
        f"{containers}.filter(c, ({SETS_VISIBLE_DEVICES})"
        f" && !{container_requests_gpu(resources, prefixes)}).map(c, c.name)"
    )


def judged(config: Mapping[str, Any]) -> str:
    """True when the policy has something to judge: a GPU request of a pod being created, or
    NVIDIA_VISIBLE_DEVICES in a container the request brings; usable without variables (the
    webhook's match condition)."""
    return f"{requests_gpu(config)} || {MENTIONS_VISIBLE_DEVICES}"


# --------------------------------------------------------------------------- exemptions

# A node's mirror pod of one of its static pods, exactly as NodeRestriction admits a node's pod:
# created by the node (user system:node:<node> in group system:nodes), annotated
# kubernetes.io/config.mirror, bound to that node and owned (controller) by that Node alone,
# as the kubelet writes it. (NodeRestriction also checks the owner's UID, against the Node.)
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/admission/noderestriction/admission.go
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/kubelet/pod/mirror_client.go
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_FROM_THE_NODE = f"request.userInfo.username == {literal(NODE_USER_PREFIX)} + "
MIRROR_POD = (
    f"request.userInfo.username.startsWith({literal(NODE_USER_PREFIX)})"
    f" && has(request.userInfo.groups) && {literal(NODES_GROUP)} in request.userInfo.groups"
    " && has(object.metadata.annotations)"
    f" && {literal(MIRROR_ANNOTATION)} in object.metadata.annotations"
    " && has(object.spec.nodeName) && object.spec.nodeName != ''"
    f" && {_FROM_THE_NODE}object.spec.nodeName"
    " && has(object.metadata.ownerReferences) && size(object.metadata.ownerReferences) == 1"
    " && object.metadata.ownerReferences.all(o, o.apiVersion == 'v1' && o.kind == 'Node'"
    f" && {_FROM_THE_NODE}o.name && has(o.controller) && o.controller)"
)


def daemonset_pod(controllers: Sequence[str]) -> str:
    """True for a pod the DaemonSet controller creates: by one of `controllers` (user names),
    for a DaemonSet, its controlling owner."""
    return (
        f"(request.userInfo.username in {literal(controllers)}"
        " && has(object.metadata.ownerReferences)"
        " && object.metadata.ownerReferences.exists(o, o.apiVersion == 'apps/v1'"
        " && o.kind == 'DaemonSet' && has(o.controller) && o.controller))"
    )


def operator_pod(config: Mapping[str, Any]) -> str:
    """True for the GPU Operator's own pods (gate data `operator_pods`; "false" without it):
    created in its namespace by one of its creators, or by a DaemonSet controller for a
    DaemonSet (its controlling owner)."""
    operator = config.get("operator_pods")
    if not operator:
        return "false"
    return (
        f"request.namespace == {literal(operator['namespace'])}"
        f" && (request.userInfo.username in {literal(operator['creators'])}"
        f" || {daemonset_pod(operator['daemonset_controllers'])})"
    )


def exempt(config: Mapping[str, Any]) -> str:
    """True for a pod the policy does not judge (a mirror pod, the operator's own); usable
    without variables."""
    return f"({MIRROR_POD}) || ({operator_pod(config)})"


# --------------------------------------------------------------------------- pool pods

# Two schedulers binding to one node each see room the other has just taken, and the kubelet
# then refuses one pod (OutOfcpu). Pods that tolerate the GPU pool's taint could be placed
# there by the default scheduler beside the GPU pods the stack's scheduler places, so they are
# kept on the stack's scheduler as GPU pods are (gate data `pool_pods`: {taint: {key, value,
# effect}, daemonset_controllers}). Not the DaemonSet controller's pods (one per node, pinned
# there; the cluster's scheduler keeps placing them), not a toleration of every taint (an
# empty key with Exists: infrastructure), not a pod created bound to a node.

# Not bound to a node when created: a scheduler will place it.
UNBOUND = "!has(object.spec.nodeName) || object.spec.nodeName == ''"


def toleration_matches(taint: Mapping[str, str], *, keyed: bool) -> str:
    """True when toleration `t` tolerates `taint` ({key, value, effect}; a toleration of it
    serves too), as the scheduler matches them: the taint's key (or, unless `keyed`, an empty
    key with Exists, which tolerates every taint), an empty effect or the taint's, Exists for
    every value, Equal (or no operator) for the same value only.
    Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/core/v1/toleration.go
    """
    key = literal(taint["key"])
    value = literal(taint.get("value", ""))
    effect = literal(taint["effect"])
    exists = "(has(t.operator) && t.operator == 'Exists')"
    equal = "(!has(t.operator) || t.operator in ['', 'Equal'])"
    names_key = f"(has(t.key) && t.key == {key})"
    if not keyed:
        names_key = f"({names_key} || ((!has(t.key) || t.key == '') && {exists}))"
    return (
        f"{names_key}"
        f" && (!has(t.effect) || t.effect == '' || t.effect == {effect})"
        f" && ({exists} || ({equal} && (has(t.value) ? t.value : '') == {value}))"
    )


def pool_taint(config: Mapping[str, Any]) -> Mapping[str, str] | None:
    """The GPU pool's taint {key, value, effect} of the gate data; None without `pool_pods`."""
    pool = config.get("pool_pods")
    return pool["taint"] if pool else None


# Why a pool pod must be on the stack's scheduler, the end of its refusal.
ONE_SCHEDULER = " (one scheduler places every pod on the pool's nodes)"


def pool_pod(config: Mapping[str, Any]) -> str:
    """True for a pod that only the stack's scheduler may place (gate data `pool_pods`;
    "false" without it): being created, not bound to a node, with a toleration that names the
    GPU pool taint's key and tolerates it, and not created by the DaemonSet controller for a
    DaemonSet. A toleration of every taint (empty key, Exists) does not count. Usable without
    variables."""
    pool = config.get("pool_pods")
    if not pool:
        return "false"
    return (
        f"{CREATING} && ({UNBOUND}) && has(object.spec.tolerations)"
        f" && object.spec.tolerations.exists(t, {toleration_matches(pool['taint'], keyed=True)})"
        f" && !{daemonset_pod(pool['daemonset_controllers'])}"
    )


def validation_variables(config: Mapping[str, Any]) -> dict[str, str]:
    """The ValidatingAdmissionPolicy's variables, in order of use."""
    resources, prefixes = gate_lists(config)
    return {
        "gpuResources": resources,
        "gpuPrefixes": prefixes,
        "requiredScheduler": literal(config["scheduler_name"]),
        "containers": NEW_CONTAINERS,
        "gpuByContainer": gpu_requests_by_container(
            "variables.containers", "variables.gpuResources", "variables.gpuPrefixes"
        ),
        # The first GPU resource (by name) of each container asking for one, and each claim,
        # of a pod being created (an ephemeral container cannot ask for resources, and what a
        # running pod asks for was judged when it was created).
        "gpuNames": f"!({CREATING}) ? [] : variables.gpuByContainer.filter(l, size(l) > 0)"
        ".map(l, " + _SMALLEST.format(l="l") + f") + ({CLAIM_NAMES})",
        "podName": "(has(object.metadata.namespace) && object.metadata.namespace != ''"
        " ? object.metadata.namespace : request.namespace) + '/'"
        " + (has(object.metadata.name) && object.metadata.name != ''"
        " ? object.metadata.name : (has(object.metadata.generateName)"
        " ? object.metadata.generateName : '<unnamed>'))",
        "schedulerShown": "has(object.spec.schedulerName)"
        " ? '\"' + object.spec.schedulerName + '\"' : 'unset'",
        "mirrorPod": MIRROR_POD,
        "operatorPod": operator_pod(config),
        "exempt": "variables.mirrorPod || variables.operatorPod",
        "unrequestedDevices": unrequested_visible_devices(
            "variables.containers", "variables.gpuResources", "variables.gpuPrefixes"
        ),
        "poolPod": pool_pod(config),
    }


def validations(config: Mapping[str, Any]) -> list[dict[str, str]]:
    """The `deny` rules of gpu_scheduler.rego, with the same messages; a mirror pod and the
    GPU Operator's own pods (variable exempt) pass them all. The fourth, on pool pods, only
    with gate data `pool_pods`.

    With several kinds of GPU resource (or several containers setting NVIDIA_VISIBLE_DEVICES)
    the message names the alphabetically first, which is the first of the Rego policy's
    (sorted) messages. The API server reports the first validation that fails.
    """
    first_gpu = _SMALLEST.format(l="variables.gpuNames")
    first_container = _SMALLEST.format(l="variables.unrequestedDevices")
    rules = [
        {
            "expression": "variables.exempt || size(variables.gpuNames) == 0"
            " || (has(object.spec.schedulerName)"
            " && object.spec.schedulerName == variables.requiredScheduler)",
            "messageExpression": "'pod \"' + variables.podName + '\" requests '"
            f" + {first_gpu}"
            " + ' but spec.schedulerName is ' + variables.schedulerShown"
            " + '; GPU pods must set spec.schedulerName: ' + variables.requiredScheduler",
            "reason": "Forbidden",
        },
        {
            # A pod created bound to a node is never scheduled.
            # (Only reported once the scheduler name is right, as the Rego policy does.)
            "expression": "variables.exempt || size(variables.gpuNames) == 0"
            " || !(has(object.spec.schedulerName)"
            " && object.spec.schedulerName == variables.requiredScheduler)"
            " || !has(object.spec.nodeName) || object.spec.nodeName == ''",
            "messageExpression": "'pod \"' + variables.podName + '\" requests '"
            f" + {first_gpu}"
            " + ' but sets spec.nodeName, which skips the scheduler; GPU pods are placed"
            " by ' + variables.requiredScheduler",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.exempt || size(variables.unrequestedDevices) == 0",
            "messageExpression": "'pod \"' + variables.podName + '\" sets "
            f"{VISIBLE_DEVICES} in container \"' + {first_container}"
            " + '\" without requesting a GPU; a container that requests none may only set it"
            " to void or none'",
            "reason": "Forbidden",
        },
    ]
    taint = pool_taint(config)
    if taint is not None:
        pool_pod_is = literal(
            f"\" tolerates the GPU pool's taint {taint['key']} but spec.schedulerName is "
        )
        rules.append(
            {
                # A pod that asks for a GPU is judged by the first rule alone.
                "expression": "variables.exempt || size(variables.gpuNames) > 0"
                " || !variables.poolPod || (has(object.spec.schedulerName)"
                " && object.spec.schedulerName == variables.requiredScheduler)",
                "messageExpression": f"'pod \"' + variables.podName + {pool_pod_is}"
                " + variables.schedulerShown + '; pods that tolerate it must set"
                " spec.schedulerName: ' + variables.requiredScheduler"
                f" + {literal(ONE_SCHEDULER)}",
                "reason": "Forbidden",
            }
        )
    return rules


# --------------------------------------------------------------------------- routing


def tolerates(toleration: Mapping[str, str]) -> str:
    """True when toleration `t` of the pod already tolerates the pool's taint, whether it
    names the taint's key or tolerates every taint (toleration_matches())."""
    return toleration_matches(toleration, keyed=False)


def routing_variables(
    config: Mapping[str, Any], toleration: Mapping[str, str] | None
) -> dict[str, str]:
    """The MutatingAdmissionPolicy's variables."""
    variables = {
        "requiredScheduler": literal(config["scheduler_name"]),
        "unrouted": "!has(object.spec.schedulerName)"
        f" || object.spec.schedulerName in ['', {literal(DEFAULT_SCHEDULER)}]",
        "onStackScheduler": "variables.unrouted"
        " || object.spec.schedulerName == variables.requiredScheduler",
    }
    if toleration is not None:
        variables["tolerated"] = (
            "has(object.spec.tolerations)"
            f" && object.spec.tolerations.exists(t, {tolerates(toleration)})"
        )
    return variables


def routing_mutations(toleration: Mapping[str, str] | None) -> list[str]:
    """JSON patch expressions: the scheduler for an unrouted GPU pod, then the pool's
    toleration for a GPU pod headed to the stack's scheduler that has none covering it.

    Both hold for the routed pod as for the original, so a reinvocation changes nothing.
    """
    mutations = [
        "variables.unrouted ? [JSONPatch{op: 'add', path: '/spec/schedulerName',"
        " value: variables.requiredScheduler}] : []"
    ]
    if toleration is not None:
        fields = ", ".join(
            f"{field}: {literal(toleration[field])}"
            for field in ("key", "operator", "value", "effect")
            if field in toleration
        )
        item = f"Object.spec.tolerations{{{fields}}}"
        mutations.append(
            "!variables.onStackScheduler || variables.tolerated ? []"
            " : has(object.spec.tolerations)"
            f" ? [JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {item}}}]"
            f" : [JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{item}]}}]"
        )
    return mutations
