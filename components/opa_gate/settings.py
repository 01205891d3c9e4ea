"""The admission section of the stack config: OpaGate's settings and the facts they name.

The engines, failure policies and the names every engine's objects share (the gate, its
webhook, its default namespace) are settings facts; the policies OPA loads default to
components/opa_gate/policies/*.rego. components/opa_gate/manifests.py renders the objects from these values.

failurePolicy: `Fail` means no GPU pod (nor pool pod: one that tolerates the GPU pool's
taint) is admitted while the gate cannot answer (OPA down, timeout), so bin-packing is never
bypassed; other CPU pods never reach OPA, so an outage does not block them. `Ignore` admits
them during an outage, possibly onto the default scheduler.
The native engines have no server to fail, so their failure policy only matters for CEL
evaluation errors.

Two rules need other sections of the stack config, so they are pure functions here that
stack_config.py calls with those values: a GPU Operator named as installed outside the stack
while the stack installs one (operator_conflict_problem), and a gate under which some GPU pods
never tolerate the GPU pool's taint (pool_toleration_problem). What only the cluster knows,
whether its API server adds that toleration itself (ExtendedResourceToleration), stays out of
them: server_toleration_resource() names the question, the preview asks it
(components/opa_gate/preview.py, check_pool_toleration) and server_toleration_problem() judges
the answer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import AfterValidator

from components.kubernetes_names import is_dns1123_label, is_dns1123_subdomain
from components.kubernetes_version import major_minor
from components.settings import BOOL, PROJECT, Problem, Settings, between, choice, text, unique

if TYPE_CHECKING:
    from components.gpu_resources import GpuResources

AdmissionEngine = Literal["mutating-admission-policy", "validating-admission-policy", "opa"]
ADMISSION_ENGINES: tuple[AdmissionEngine, ...] = get_args(AdmissionEngine)
FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = get_args(FailurePolicy)

POLICY_DIR = Path(__file__).resolve().parent / "policies"
# The engine that routes GPU pods (MutatingAdmissionPolicy) and the first minor version that
# serves its GA API, admissionregistration.k8s.io/v1, without a feature gate.
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/mutating-admission-policy/
ROUTING_ENGINE: AdmissionEngine = "mutating-admission-policy"
ROUTING_MIN_MINOR = 36
# Name of the ValidatingWebhookConfiguration, ValidatingAdmissionPolicy and its binding
# (and of the MutatingAdmissionPolicy and its binding).
GATE_NAME = "gpu-scheduler-gate"
# The gate's namespace when none is given (OpaGateArgs.namespace's default).
DEFAULT_GATE_NAMESPACE = "gpu-admission"
WEBHOOK_NAME = f"gpu-scheduler.{PROJECT}.io"
# An operator the stack does not install lives in a namespace the stack neither creates nor
# deletes: never the gate's own (the gate would take it over, and destroy would delete it).
EXTERNAL_OPERATOR_NAMESPACE = text(
    lambda v: v == "" or (is_dns1123_label(v) and v != DEFAULT_GATE_NAMESPACE),
    "expected the namespace (DNS-1123 label) of a GPU Operator installed outside the stack, "
    f"or empty; not the gate's own ({DEFAULT_GATE_NAMESPACE})",
)
# Where pods that ask for no GPU may run on the GPU pool's nodes.
POOL_NAMESPACE = text(
    is_dns1123_label,
    "expected the name of a namespace (DNS-1123 label) whose pods may run on the GPU pool's "
    "nodes without asking for a GPU",
)


def _is_daemonset_ref(value: str) -> bool:
    namespace, _, name = value.partition("/")
    return is_dns1123_label(namespace) and is_dns1123_subdomain(name)


POOL_DAEMONSET = text(
    _is_daemonset_ref,
    "expected namespace/name of a DaemonSet (a DNS-1123 label, a DNS-1123 subdomain) whose "
    "pods may run on the GPU pool's nodes without asking for a GPU",
)


def load_policies(directory: Path = POLICY_DIR) -> dict[str, str]:
    """{file stem: Rego source} of the policies in `directory`, tests excluded."""
    return {
        path.stem: path.read_text()
        for path in sorted(directory.glob("*.rego"))
        if not path.stem.endswith("_test")
    }


class OpaGateSettings(Settings):
    """The gate that keeps GPU pods on the binpack scheduler (the stack config's admission)."""

    engine: Annotated[AdmissionEngine, choice(ADMISSION_ENGINES)] = ROUTING_ENGINE
    """`mutating-admission-policy` (native, Kubernetes v1.36+: GPU pods that leave
    spec.schedulerName unset are routed to the binpack scheduler and given the pool's
    toleration; only what cannot be routed is refused), `validating-admission-policy`
    (native, refuses GPU pods off the binpack scheduler) or `opa` (webhook, refuses them
    too); these two add no toleration, so with a NoSchedule pool the API server must run
    ExtendedResourceToleration (the stack's controlPlane.admissionPlugins, or the cluster's
    own: the preview asks it). Pods that ask for no GPU are kept off the pool's nodes
    outside poolNamespaces and poolDaemonSets; there, those that tolerate the pool's taint
    (not DaemonSet pods) are kept on the binpack scheduler like GPU pods, by every engine. The
    native engines need no server."""
    failure_policy: Annotated[FailurePolicy, choice(FAILURE_POLICIES)] = "Fail"
    """Fail: a GPU pod (or a pod that tolerates the pool's taint) is refused while the gate
    cannot answer. Ignore: it is admitted."""
    timeout_seconds: Annotated[int, between(1, 30)] = 5
    """Webhook timeout in seconds (the API server allows 1-30)."""
    replicas: Annotated[int, between(1, 5)] = 2
    """OPA replicas (engine opa)."""
    gate_extended_resources: Annotated[bool, BOOL] = True
    """Also gate the extended resources this stack advertises (extendedResources)."""
    external_gpu_operator_namespace: Annotated[str, EXTERNAL_OPERATOR_NAMESPACE] = ""
    """Namespace of a GPU Operator installed outside this stack (gpuOperator.enabled false):
    its own pods are let through as the stack's operator's are (the validator's workloads, its
    DaemonSets' operands). Empty: none."""
    pool_namespaces: Annotated[
        tuple[Annotated[str, POOL_NAMESPACE], ...],
        AfterValidator(unique("each namespace at most once")),
    ] = ()
    """Namespaces whose pods may run on the GPU pool's nodes without asking for a GPU (bound
    to one, or tolerating the pool's taint): node agents, say. Anywhere else the gate refuses
    such a pod. The monitoring namespace (monitoring.enabled) is added; kube-system, the
    gate's and the GPU Operator's own pods are not judged. The preview refuses while a
    DaemonSet, Deployment, StatefulSet or CronJob elsewhere that runs pods tolerates the pool's
    taint (one that runs none is a warning)."""
    pool_daemon_sets: Annotated[
        tuple[Annotated[str, POOL_DAEMONSET], ...],
        AfterValidator(unique("each DaemonSet at most once")),
    ] = ()
    """DaemonSets (namespace/name) whose pods may run on the GPU pool's nodes without asking
    for a GPU, in a namespace not in poolNamespaces."""


# --------------------------------------------------------------------------- the GPU Operator


def operator_conflict_problem(
    *,
    external_namespace: str,
    operator_enabled: bool,
    operator_namespace: str,
    created_namespaces: Mapping[str, str] | None = None,
) -> Problem | None:
    """admission.externalGpuOperatorNamespace against the rest of the stack config.

    A GPU Operator outside the stack is named only where the stack installs none: a cluster
    runs one GPU Operator (one cluster-wide ClusterPolicy), and the stack's own operator's pods
    are already let through. Nor may it live in a namespace another layer creates
    (`created_namespaces`: {namespace: the key that names it}), which `pulumi destroy` would
    delete with the operator in it. None when consistent.
    """
    if not external_namespace:
        return None
    key = f"{SECTION}.externalGpuOperatorNamespace"
    if operator_enabled:
        same = " (the same namespace)" if external_namespace == operator_namespace else ""
        return Problem(
            key,
            external_namespace,
            "names a GPU Operator installed outside the stack, but the stack installs one "
            f"(gpuOperator.enabled true, gpuOperator.namespace {operator_namespace}{same}), "
            "whose pods the gate already lets through; a cluster runs one GPU Operator: leave "
            "this empty, or set gpuOperator.enabled false to keep the one installed outside",
        )
    taken = (created_namespaces or {}).get(external_namespace)
    if taken is not None:
        return Problem(
            key,
            external_namespace,
            f"is {taken}, a namespace the stack creates and `pulumi destroy` deletes; expected "
            "the namespace the GPU Operator installed outside the stack runs in",
        )
    return None


# --------------------------------------------------------------------------- DRA claims


def claim_lookup_problem(*, engine: str, device_classes: Collection[str]) -> Problem | None:
    """The engine against how GPUs reach pods (gpuOperator.allocation): with DRA, a pod's
    resource claim is a GPU request only when the ResourceClaimTemplate or ResourceClaim it
    names selects a GPU DeviceClass (`device_classes`), which admission must look up. The
    native engines do (a claim policy per kind, its objects as parameters); OPA sees only the
    AdmissionReview, and nothing the stack can run gives it the cluster's claims (no
    replication of objects into OPA's data is available to the stack), so it would count every
    claim, a NIC's too, as a GPU. None when consistent."""
    if engine != "opa" or not device_classes:
        return None
    natives = [e for e in ADMISSION_ENGINES if e != "opa"]
    return Problem(
        f"{SECTION}.engine",
        engine,
        "cannot tell GPU resource claims from others with gpuOperator.allocation dra: a claim "
        f"is a GPU request only when the ResourceClaimTemplate or ResourceClaim it names "
        f"selects one of the DeviceClasses {', '.join(sorted(device_classes))}, and OPA sees "
        f"only the pod, not those objects; allowed with dra: {' or '.join(natives)} (they "
        "look the objects up), or gpuOperator.allocation device-plugin to keep opa",
    )


# --------------------------------------------------------------------------- the pool's taint

# The API server's admission plugin that gives a pod one toleration per extended resource its
# containers and init containers request: key the resource's name, operator Exists, effect
# NoSchedule. It is off unless enabled (controlPlane.admissionPlugins).
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/admission/extendedresourcetoleration/admission.go
EXTENDED_RESOURCE_TOLERATION = "ExtendedResourceToleration"
# The one taint effect that keeps an untolerating pod off a node; PreferNoSchedule only
# steers the scheduler away from it.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
BLOCKING_EFFECT = "NoSchedule"
SECTION = "admission"
"""The gate's section of the stack config (OpaGate.CONFIG_SECTION)."""


def pool_resources(
    device: GpuResources,
    extended_resources: Mapping[str, Mapping[str, int]],
    pool_nodes: Collection[str],
    *,
    gate_extended_resources: bool,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, prefixes) of the gated resources a pod may find only on the GPU pool: what the
    device plugin advertises there (`device`) and, when the gate judges them, the extended
    resources the stack advertises on pool nodes. A resource no pool node has never draws a
    pod to the pool, so its pods need no toleration of the pool's taint."""
    extended = (
        {
            name
            for node, counts in extended_resources.items()
            if node in pool_nodes
            for name, count in counts.items()
            if count > 0
        }
        if gate_extended_resources
        else set()
    )
    return tuple(sorted({*device.names, *extended})), tuple(sorted(set(device.prefixes)))


def untolerated_pool_resources(
    *,
    engine: str,
    admission_plugins: Collection[str],
    taint_key: str,
    taint_effect: str,
    names: Iterable[str],
    prefixes: Iterable[str],
) -> tuple[str, ...]:
    """The pool resources (names; prefixes as `<prefix>*`) whose gated pods, asking for that
    resource alone, end up without a toleration of the pool's taint and stay Pending.

    The routing engine adds the pool's toleration to every GPU pod it admits. The refusing
    engines add nothing: a pod then has only its own tolerations and, with
    ExtendedResourceToleration on, one per extended resource it requests, which covers the
    taint only when the taint's key is that resource's name (operator Exists, effect
    NoSchedule). A resource matched by a prefix cannot be that name. A PreferNoSchedule taint
    strands no pod.
    """
    if engine == ROUTING_ENGINE or taint_effect != BLOCKING_EFFECT:
        return ()
    covered = {taint_key} if EXTENDED_RESOURCE_TOLERATION in admission_plugins else set()
    return (
        *(n for n in sorted(set(names)) if n not in covered),
        *(f"{p}*" for p in sorted(set(prefixes))),
    )


def _ways_out(kubernetes_version: str, plugin: str, pool: str) -> str:
    """The `allowed:` part of a refusal for stranded GPU pods: the routing engine, the
    API server's plugin (`plugin`: where it is turned on) with `pool`, or a taint that strands
    nothing."""
    minor = (major_minor(kubernetes_version) or (0, 0))[1]
    routing = f"{ROUTING_ENGINE} (it adds the pool's toleration to every GPU pod)"
    if minor < ROUTING_MIN_MINOR:
        routing += (
            f" once kubernetesVersion is v1.{ROUTING_MIN_MINOR} or newer (it is "
            f"{kubernetes_version})"
        )
    return f"allowed: {routing}; or {plugin} and {pool}; or gpuPool.taint.effect PreferNoSchedule"


def pool_toleration_problem(
    *,
    engine: str,
    kubernetes_version: str,
    admission_plugins: Collection[str],
    taint: Mapping[str, str],
    names: Iterable[str],
    prefixes: Iterable[str],
) -> Problem | None:
    """The engine against the rest of the stack config: every GPU pod the gate keeps on the
    binpack scheduler must tolerate the GPU pool's taint, or it stays Pending for good.

    `admission_plugins`: those controlPlane enables (empty when controlPlane is off);
    `taint`: gpuPool.taint {key, value, effect}; `names`, `prefixes`: pool_resources().

    Pure, so it refuses only what no API server could mend: the pods left untolerated even
    with ExtendedResourceToleration on. Whether the cluster's API server runs that plugin
    when the stack does not enable it is the live question of server_toleration_resource(),
    asked at preview. None when every such pod tolerates the taint, or may once the cluster
    is asked.
    """
    key, effect = taint["key"], taint["effect"]
    names, prefixes = tuple(names), tuple(prefixes)
    stranded = untolerated_pool_resources(
        engine=engine,
        admission_plugins={*admission_plugins, EXTENDED_RESOURCE_TOLERATION},
        taint_key=key,
        taint_effect=effect,
        names=names,
        prefixes=prefixes,
    )
    if not stranded:
        return None
    only = names[0] if len(names) == 1 and not prefixes else None
    pool = (
        f"gpuPool.taint.key {only}"
        if only is not None
        else "a pool whose one GPU resource is gpuPool.taint.key (no gpuOperator.mig.strategy "
        "mixed, no gpuOperator.devicePlugin.timeSlicing.renameByDefault, no extendedResources "
        "on pool nodes unless admission.gateExtendedResources is false)"
    )
    if EXTENDED_RESOURCE_TOLERATION in admission_plugins:
        why = f"{EXTENDED_RESOURCE_TOLERATION} tolerates"
        plugin = f"controlPlane.admissionPlugins with {EXTENDED_RESOURCE_TOLERATION}"
    else:
        why = (
            f"nor would the API server: {EXTENDED_RESOURCE_TOLERATION} (which the cluster may "
            "run without this stack enabling it) tolerates"
        )
        plugin = (
            f"{EXTENDED_RESOURCE_TOLERATION} on the API servers (controlPlane.admissionPlugins, "
            "or the cluster's own)"
        )
    return Problem(
        f"{SECTION}.engine",
        engine,
        f"GPU pods asking only for {', '.join(stranded)} would never tolerate the GPU pool's "
        f"taint {key}={taint.get('value', '')}:{effect} and stay Pending: this engine adds no "
        f"toleration, {why} a taint only when its key is the requested resource "
        f"(gpuPool.taint.key is {key}); {_ways_out(kubernetes_version, plugin, pool)}",
    )


# --------------------------------------------------------------------------- asked at preview


def server_toleration_resource(
    *,
    engine: str,
    admission_plugins: Collection[str],
    taint: Mapping[str, str],
    names: Iterable[str],
    prefixes: Iterable[str],
) -> str | None:
    """The GPU resource whose pods tolerate the pool's taint only if the cluster's API server
    runs ExtendedResourceToleration, which the stack does not enable (`admission_plugins`, as
    for pool_toleration_problem()): the cluster is asked at preview with a dry-run pod asking
    for it (components/opa_gate/preview.py, check_pool_toleration), and
    server_toleration_problem() judges the answer. None when the config decides alone: the
    routing engine, a taint that strands nothing, the stack's own plugin, or a pool the plugin
    could not cover anyway (pool_toleration_problem() refuses it)."""
    key, effect = taint["key"], taint["effect"]
    names, prefixes = tuple(names), tuple(prefixes)

    def stranded(plugins: Collection[str]) -> tuple[str, ...]:
        return untolerated_pool_resources(
            engine=engine,
            admission_plugins=plugins,
            taint_key=key,
            taint_effect=effect,
            names=names,
            prefixes=prefixes,
        )

    if stranded({*admission_plugins, EXTENDED_RESOURCE_TOLERATION}):
        return None
    left = stranded(admission_plugins)
    # Covered by the plugin alone: the pool's one resource, named like the taint's key.
    return left[0] if left == (key,) else None


def added_toleration(resource: str) -> dict[str, str]:
    """The toleration ExtendedResourceToleration adds to a pod requesting `resource`."""
    return {"key": resource, "operator": "Exists", "effect": BLOCKING_EFFECT}


def server_toleration_problem(
    *,
    engine: str,
    kubernetes_version: str,
    taint: Mapping[str, str],
    resource: str,
    tolerations: Iterable[Mapping[str, object]],
) -> Problem | None:
    """The cluster's answer to the question of server_toleration_resource(): `tolerations`
    are those a pod asking for `resource` alone, created without any, was admitted with (a
    dry-run). None when ExtendedResourceToleration added its toleration of `resource` (which
    covers the taint: its key is `resource`, its effect NoSchedule); otherwise GPU pods
    asking for `resource` would stay Pending, and the engine is refused.

    Only the plugin's own toleration counts, not any other that tolerates the taint: a
    toleration some other mutation added in the probe's namespace (a routing gate from an
    earlier config, say) says nothing about the pods of other namespaces.
    """
    wanted = added_toleration(resource)
    if any({k: t.get(k) for k in wanted} == wanted and not t.get("value") for t in tolerations):
        return None
    key, effect = taint["key"], taint["effect"]
    pool = f"gpuPool.taint.key {resource}"
    plugin = (
        f"{EXTENDED_RESOURCE_TOLERATION} on the API servers (their --enable-admission-plugins, "
        f"or controlPlane.enabled with controlPlane.admissionPlugins {EXTENDED_RESOURCE_TOLERATION})"
    )
    return Problem(
        f"{SECTION}.engine",
        engine,
        f"GPU pods asking only for {resource} would never tolerate the GPU pool's taint "
        f"{key}={taint.get('value', '')}:{effect} and stay Pending: this engine adds no "
        "toleration, nor does the cluster's API server: a pod asking for it, created with "
        f"dryRun=All, came back without the toleration {resource} Exists {BLOCKING_EFFECT} "
        f"that {EXTENDED_RESOURCE_TOLERATION} adds (the plugin is off); "
        f"{_ways_out(kubernetes_version, plugin, pool)}",
    )
