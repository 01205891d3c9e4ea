"""OpaGate: admission control that keeps GPU pods on the binpack scheduler.

It judges pod CREATEs that request or limit a GPU resource (any resource of a GPU device
plugin's domain, components/gpu_resources.py: the one definition the binpack scheduler weighs
too; what the GPU Operator's settings advertise, and the extended resources this stack
advertises) or ask for devices through DRA (spec.resourceClaims): unless spec.schedulerName is
the binpack scheduler they are refused, with a message naming the pod, the resource and the
required scheduler. A container that sets NVIDIA_VISIBLE_DEVICES (to anything but void or
none) without requesting a GPU itself is refused too: with the container toolkit's default it
would reach every GPU of its node unseen (GpuOperator also tells the toolkit to ignore the
variable; the gate is for what the toolkit's settings do not cover, privileged containers and
a toolkit the stack does not install). Two kinds of pod are not judged: a node's mirror pods
of its static pods (they run whatever the gate says; refusing the mirror only hides their
GPUs from the scheduler), recognised exactly as NodeRestriction admits them, and the GPU
Operator's own pods (GpuOperatorSettings.operator_pods(): in its namespace, created by its
validator or by the DaemonSet controller for a DaemonSet). The scheduler name, resource names,
pool toleration and operator's pods are data handed over from the layers that own them, never
written into the policy source. Three engines:
- `mutating-admission-policy` (the default; Kubernetes v1.36+, where the API is GA): a
  MutatingAdmissionPolicy first routes GPU pods that leave spec.schedulerName unset to the
  binpack scheduler and adds the GPU pool's toleration when no toleration of theirs covers
  the taint; the ValidatingAdmissionPolicy below then refuses only what cannot be routed (a
  scheduler of the pod's own, a preset spec.nodeName). No server, nothing to be down.
- `opa`: OPA 1.x behind a ValidatingWebhookConfiguration, with the Rego v1 policies from
  policies/ loaded at start-up from a mounted ConfigMap (GPU resource names and scheduler
  name reach them as data); nothing pushes policies at run time, so a restarted OPA is
  ready as soon as it has read its files. A CA and serving certificate from pulumi-tls (kept
  in state, renewed in the last 30 days of the serving certificate). Only pods that request a
  gated resource or mention NVIDIA_VISIBLE_DEVICES are sent to OPA (matchConditions).
- `validating-admission-policy`: a native ValidatingAdmissionPolicy (CEL, GA since 1.30)
  with the same data written into its CEL and the same rule and message as OPA's; no webhook
  server at all.

The module-level functions build what both the component and the live tests create
(webhook, OPA arguments and files, the policy and its binding): one source of truth.

Every engine excludes kube-system and the gate's own namespace by name (the immutable
kubernetes.io/metadata.name label), so the gate can never stop the cluster from restarting
the gate itself, and no one who can label a namespace can take it out of the gate.

failurePolicy: `Fail` means no GPU pod is admitted while the gate cannot answer (OPA down,
timeout), so bin-packing is never bypassed; CPU pods never reach OPA, so an outage does not
block them. `Ignore` admits GPU pods during an outage, possibly onto the default scheduler.
The native engines have no server to fail, so their failure policy only matters for CEL
evaluation errors.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import pulumi
import pulumi_kubernetes as k8s
import pulumi_tls as tls
from pydantic import Field

from components.cluster_access import ClusterAccess
from components.gpu_operator import OperatorPods
from components.gpu_resources import gated_names, gated_prefixes
from components.settings import BOOL, Runtime, Settings, between, choice
from policies import gpu_scheduler_cel as cel

TOKEN = "gpu-cluster:index:OpaGate"

AdmissionEngine = Literal["mutating-admission-policy", "validating-admission-policy", "opa"]
ADMISSION_ENGINES: tuple[AdmissionEngine, ...] = get_args(AdmissionEngine)
FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = get_args(FailurePolicy)

POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
# Set by the API server on every namespace to the namespace's name; it cannot be changed.
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-metadata-name
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
OPA_PORT = 8443
# Built in, and usable outside kube-system since Kubernetes 1.17 (unless the cluster limits
# it with a ResourceQuota admission configuration); the class cluster add-ons run with.
# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/
OPA_PRIORITY_CLASS = "system-cluster-critical"
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
WEBHOOK_NAME = "gpu-scheduler.gpu-cluster.io"
GATE_CONFIG_FILE = "gate.json"
# A mounted ConfigMap holds each key twice more, under the kubelet's `..data` link and its
# timestamped `..<date>` directory; loading those as well redeclares every rule and OPA
# refuses to start. Files named `..*` are skipped.
# Ref: https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically
CONFIGMAP_INTERNALS = "..*"


def load_policies(directory: Path = POLICY_DIR) -> dict[str, str]:
    """{file stem: Rego source} of the policies in `directory`, tests excluded."""
    return {
        path.stem: path.read_text()
        for path in sorted(directory.glob("*.rego"))
        if not path.stem.endswith("_test")
    }


def gate_data(
    scheduler_name: str,
    resources: Sequence[str],
    prefixes: Sequence[str],
    *,
    operator_pods: OperatorPods | None = None,
) -> dict[str, Any]:
    """The policies' data document, data.gpu_cluster.config (see policies/README.md).

    Every GPU (components/gpu_resources.py) is gated whatever `resources` and `prefixes` add;
    `operator_pods` (the GPU Operator's own pods) are left out when None.
    """
    data: dict[str, Any] = {
        "scheduler_name": scheduler_name,
        "gpu_resources": gated_names(resources),
        "gpu_resource_prefixes": gated_prefixes(prefixes),
    }
    if operator_pods is not None:
        data["operator_pods"] = {
            "namespace": operator_pods.namespace,
            "creators": sorted(operator_pods.creators),
            "daemonset_controllers": sorted(operator_pods.daemonset_controllers),
        }
    return data


def excluded_namespaces(gate_namespace: str) -> list[str]:
    """The namespaces neither engine judges: kube-system and the gate's own."""
    return sorted({"kube-system", gate_namespace})


def namespace_selector(gate_namespace: str) -> dict[str, Any]:
    """Namespace selector of both engines: every namespace but excluded_namespaces(), by name.

    A selector on a label anyone may set (such as openpolicyagent.org/webhook=ignore) lets
    whoever can create or label a namespace bypass the gate; the name label cannot be set.
    """
    return {
        "matchExpressions": [
            {
                "key": NAMESPACE_NAME_LABEL,
                "operator": "NotIn",
                "values": excluded_namespaces(gate_namespace),
            }
        ]
    }


def policy_files(policies: Mapping[str, str]) -> dict[str, str]:
    """{file name: Rego source} of the one ConfigMap OPA loads at start-up: every policy."""
    return {f"{stem}.rego": source for stem, source in sorted(policies.items())}


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
    Authorization (policies/authz.rego) leaves anonymous callers, the API server and the
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


def gpu_request_condition(config: Mapping[str, Any]) -> str:
    """CEL, true when the pod asks for a gated GPU resource: the routing policy's condition.

    Built from the same pieces as the ValidatingAdmissionPolicy's variables, with the lists
    written in (match conditions have no variables).
    """
    return cel.requests_gpu(config)


def webhook_condition(config: Mapping[str, Any]) -> str:
    """CEL, the webhook's match condition: a GPU request (gpu_request_condition), or
    NVIDIA_VISIBLE_DEVICES in some container, from a pod the policy judges (not a mirror pod,
    not the GPU Operator's own: the device plugin's pods set the variable). Other pods never
    reach OPA, so an OPA outage cannot hold them back."""
    return f"!({cel.exempt(config)}) && ({cel.judged(config)})"


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


def webhook_spec(
    *,
    config: Mapping[str, Any],
    client_config: Mapping[str, Any],
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration's one webhook; OPA answers at path `/`.

    `config` is gate_data(): only pod CREATEs that ask for one of its GPU resources or mention
    NVIDIA_VISIBLE_DEVICES are sent (matchConditions, GA since 1.30); with failurePolicy Fail
    an OPA outage then holds back those pods only.
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
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "matchConditions": [{"name": "gpu-pod", "expression": webhook_condition(config)}],
        "clientConfig": dict(client_config),
    }


def admission_policy_spec(
    config: Mapping[str, Any],
    failure_policy: FailurePolicy = "Fail",
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: policies/gpu_scheduler.rego's rule and message in CEL.

    `config` is gate_data(); it is written into the CEL as literals rather than read from a
    parameter object, because a binding whose parameter is missing denies every request it
    matches, CPU pods included, and a ConfigMap could drop the always-gated nvidia.com/gpu.
    With several kinds of GPU resource the message names the alphabetically first, which is
    the first of the Rego policy's (sorted) messages.
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/
    """
    return {
        "failurePolicy": failure_policy,
        "matchConstraints": {
            "namespaceSelector": namespace_selector(gate_namespace),
            "resourceRules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
        },
        "variables": [
            {"name": n, "expression": e} for n, e in cel.validation_variables(config).items()
        ],
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
    config: Mapping[str, Any],
    toleration: Mapping[str, str] | None,
    failure_policy: FailurePolicy = "Fail",
    *,
    gate_namespace: str = DEFAULT_GATE_NAMESPACE,
) -> dict[str, Any]:
    """The MutatingAdmissionPolicy that routes GPU pods to the stack's scheduler.

    A pod CREATE that asks for a gated GPU resource and leaves spec.schedulerName unset (the
    API server has filled in default-scheduler by then) gets the stack's scheduler; a GPU pod
    headed there also gets the pool's `toleration` unless one of its tolerations already
    covers the taint. A pod with another scheduler is left as it is (the
    ValidatingAdmissionPolicy refuses it), and so is a pod created bound to a node (refused
    too, unless it is a node's mirror pod, which must stay as its kubelet wrote it, or the GPU
    Operator's validator workload).
    JSON patches, because spec.tolerations is an atomic list that an apply configuration may
    not change. Both mutations hold for the routed pod as for the original, so a reinvocation
    changes nothing.
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/mutating-admission-policy/
    """
    return {
        "failurePolicy": failure_policy,
        "reinvocationPolicy": "IfNeeded",
        "matchConstraints": {
            "namespaceSelector": namespace_selector(gate_namespace),
            "resourceRules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
        },
        "matchConditions": [
            {"name": "requests-gpu", "expression": gpu_request_condition(config)},
            {"name": "not-bound", "expression": cel.UNBOUND},
        ],
        "variables": [
            {"name": n, "expression": e}
            for n, e in cel.routing_variables(config, toleration).items()
        ],
        "mutations": [
            {"patchType": "JSONPatch", "jsonPatch": {"expression": e}}
            for e in cel.routing_mutations(toleration)
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


class OpaGateSettings(Settings):
    """The gate that keeps GPU pods on the binpack scheduler (the stack config's admission)."""

    engine: Annotated[AdmissionEngine, choice(ADMISSION_ENGINES)] = ROUTING_ENGINE
    """`mutating-admission-policy` (native, Kubernetes v1.36+: GPU pods that leave
    spec.schedulerName unset are routed to the binpack scheduler and given the pool's
    toleration; only what cannot be routed is refused), `validating-admission-policy`
    (native, refuses GPU pods off the binpack scheduler) or `opa` (webhook, refuses them
    too). The native engines need no server."""
    failure_policy: Annotated[FailurePolicy, choice(FAILURE_POLICIES)] = "Fail"
    """Fail: a GPU pod is refused while the gate cannot answer. Ignore: it is admitted."""
    timeout_seconds: Annotated[int, between(1, 30)] = 5
    """Webhook timeout in seconds (the API server allows 1-30)."""
    replicas: Annotated[int, between(1, 5)] = 2
    """OPA replicas (engine opa)."""
    gate_extended_resources: Annotated[bool, BOOL] = True
    """Also gate the extended resources this stack advertises (extendedResources)."""


class OpaGateArgs(OpaGateSettings):
    """Inputs of OpaGate: its settings plus the scheduler's name and what to gate."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""
    scheduler_name: Annotated[pulumi.Output[str] | str, Runtime()]
    """The schedulerName GPU pods must use (BinpackScheduler's output)."""
    gpu_resources: Annotated[pulumi.Output[list[str]] | Sequence[str], Runtime()] = ()
    """Advertised extended resources (ExtendedResourceNode's outputs); gated when
    gate_extended_resources is true."""
    device_resources: Annotated[Sequence[str], Runtime()] = ()
    """GPU resource names the device plugin advertises (GpuOperator's settings); always
    gated (nvidia.com/gpu is gated anyway)."""
    gpu_resource_prefixes: Annotated[Sequence[str], Runtime()] = ()
    """Extra resource name prefixes to gate, e.g. MIG profiles under mig.strategy mixed
    (every GPU device plugin's domain is always gated)."""
    operator_pods: Annotated[OperatorPods | None, Runtime()] = None
    """The GPU Operator's own pods (GpuOperatorSettings.operator_pods()), let through; None
    when the operator is not deployed."""
    pool_toleration: Annotated[
        pulumi.Output[dict[str, str]] | Mapping[str, str] | None, Runtime()
    ] = None
    """The GPU pool's toleration (TaintedGpuPool's output); the routing engine adds it to
    routed GPU pods that lack it. None adds none."""
    namespace: Annotated[str, Runtime()] = DEFAULT_GATE_NAMESPACE
    """The gate's own namespace (created, and excluded from the gate)."""
    opa_image: Annotated[str, Runtime()] = "openpolicyagent/opa:1.22.2"
    """OPA 1.x image."""
    policies: Annotated[Mapping[str, str], Runtime()] = Field(default_factory=load_policies)
    """{name: Rego source}; defaults to policies/*.rego without tests."""


class OpaGate(pulumi.ComponentResource):
    """Keeps GPU pods on the binpack scheduler, with OPA or a ValidatingAdmissionPolicy."""

    engine: pulumi.Output[str]
    """The engine in use."""
    namespace: pulumi.Output[str]
    """The gate's namespace."""
    ca_cert_pem: pulumi.Output[str]
    """CA that signed OPA's serving certificate ("" for the native engine)."""
    policy_name: pulumi.Output[str]
    """Name of the ValidatingWebhookConfiguration or ValidatingAdmissionPolicy."""
    serving_cert_not_after: pulumi.Output[str]
    """When OPA's serving certificate expires, RFC 3339 ("" for the native engine)."""

    def __init__(
        self, name: str, args: OpaGateArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        self._name = name
        self._args = args
        self._child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)
        self._labels = {
            "app.kubernetes.io/name": "gpu-scheduler-gate",
            "app.kubernetes.io/part-of": "gpu-cluster",
        }

        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": args.namespace, "labels": self._labels},
            opts=self._child,
        )
        gated = args.gpu_resources if args.gate_extended_resources else ()
        config = pulumi.Output.all(args.scheduler_name, gated).apply(
            lambda v: gate_data(
                v[0],
                [*args.device_resources, *v[1]],
                args.gpu_resource_prefixes,
                operator_pods=args.operator_pods,
            )
        )
        exclusions: list[pulumi.Resource] = [namespace]
        if args.engine == "opa":
            ca_pem, not_after, policy_name = self._opa(config, exclusions)
        else:
            ca_pem = not_after = pulumi.Output.from_input("")
            policy_name = self._native(config, exclusions)
            if args.engine == ROUTING_ENGINE:
                self._routing(config, exclusions)

        self.engine = pulumi.Output.from_input(args.engine)
        self.namespace = namespace.metadata.apply(lambda _: args.namespace)
        self.ca_cert_pem = ca_pem
        self.policy_name = policy_name
        self.serving_cert_not_after = not_after
        self.register_outputs(
            {
                "engine": self.engine,
                "namespace": self.namespace,
                "ca_cert_pem": self.ca_cert_pem,
                "policy_name": self.policy_name,
                "serving_cert_not_after": self.serving_cert_not_after,
            }
        )

    # ------------------------------------------------------------------ helpers

    def _meta(self, name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "namespace": self._args.namespace, "labels": self._labels, **extra}

    # ------------------------------------------------------------------ engine: opa

    def _certificates(
        self, service: str
    ) -> tuple[tls.PrivateKey, tls.SelfSignedCert, tls.LocallySignedCert]:
        """CA and serving certificate, kept in state: no new certificate on each up."""
        name, ns = self._name, self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        ca_key = tls.PrivateKey(f"{name}-ca-key", algorithm="ECDSA", ecdsa_curve="P256", opts=child)
        ca = tls.SelfSignedCert(
            f"{name}-ca",
            private_key_pem=ca_key.private_key_pem,
            is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name="gpu-cluster admission CA"),
            validity_period_hours=10 * 365 * 24,
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            opts=child,
        )
        key = tls.PrivateKey(
            f"{name}-serving-key", algorithm="ECDSA", ecdsa_curve="P256", opts=child
        )
        dns_names = [f"{service}.{ns}.svc", f"{service}.{ns}.svc.cluster.local"]
        request = tls.CertRequest(
            f"{name}-serving-csr",
            private_key_pem=key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(common_name=dns_names[0]),
            dns_names=dns_names,
            opts=child,
        )
        cert = tls.LocallySignedCert(
            f"{name}-serving-cert",
            cert_request_pem=request.cert_request_pem,
            ca_private_key_pem=ca_key.private_key_pem,
            ca_cert_pem=ca.cert_pem,
            validity_period_hours=2 * 365 * 24,
            # Renewed by the first `pulumi up` in its last 30 days, not before.
            early_renewal_hours=30 * 24,
            allowed_uses=["digital_signature", "key_encipherment", "server_auth"],
            opts=child,
        )
        return key, ca, cert

    def _opa(
        self, config: pulumi.Output[dict[str, Any]], exclusions: list[pulumi.Resource]
    ) -> tuple[pulumi.Output[str], pulumi.Output[str], pulumi.Output[str]]:
        name, args, child = self._name, self._args, self._child
        service_name = "opa"
        key, ca, cert = self._certificates(service_name)
        serving = k8s.core.v1.Secret(
            f"{name}-serving",
            metadata=self._meta("opa-serving"),
            type="kubernetes.io/tls",
            string_data={"tls.crt": cert.cert_pem, "tls.key": key.private_key_pem},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        policy_map = k8s.core.v1.ConfigMap(
            f"{name}-policies",
            metadata=self._meta("opa-policies"),
            data=policy_files(args.policies),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        gate_config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=self._meta("gpu-gate-config"),
            data={GATE_CONFIG_FILE: config.apply(lambda c: json.dumps(c, sort_keys=True))},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        # OPA reads only its mounted files: its identity needs no API access and no token.
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=self._meta("opa"),
            automount_service_account_token=False,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        selector = {"app.kubernetes.io/name": "opa"}
        https = {"scheme": "HTTPS", "port": OPA_PORT}
        pod_spec: Any = {
            "serviceAccountName": account.metadata.name,
            "automountServiceAccountToken": False,
            # Scheduled, and kept, ahead of ordinary workloads: GPU pods wait on it.
            "priorityClassName": OPA_PRIORITY_CLASS,
            "affinity": opa_affinity(selector),
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "opa",
                    "image": args.opa_image,
                    "args": opa_run_args(),
                    "ports": [{"name": "https", "containerPort": OPA_PORT}],
                    "readinessProbe": {
                        "httpGet": {**https, "path": "/health/ready"},
                        "periodSeconds": 5,
                    },
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
                },
            ],
            "volumes": [
                {"name": "certs", "secret": {"secretName": serving.metadata.name}},
                {"name": "policies", "configMap": {"name": policy_map.metadata.name}},
                {"name": "config", "configMap": {"name": gate_config.metadata.name}},
            ],
        }
        deployment = k8s.apps.v1.Deployment(
            f"{name}-opa",
            metadata=self._meta("opa"),
            spec={
                "replicas": args.replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {
                        "labels": {**self._labels, **selector},
                        # OPA reads its files once: new certificates, policies or config
                        # roll the Deployment.
                        "annotations": {
                            "gpu-cluster.io/inputs-sha256": pulumi.Output.all(
                                cert.cert_pem, config, policy_files(args.policies)
                            ).apply(
                                lambda v: hashlib.sha256(
                                    json.dumps(v, sort_keys=True).encode()
                                ).hexdigest()
                            )
                        },
                    },
                    "spec": pod_spec,
                },
            },
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        budget = opa_disruption_budget(args.replicas, selector)
        if budget is not None:
            k8s.policy.v1.PodDisruptionBudget(
                f"{name}-opa-budget",
                metadata=self._meta("opa"),
                spec=budget,
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=exclusions)
                ),
            )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=self._meta(service_name),
            spec={
                "selector": selector,
                "ports": [{"name": "https", "port": 443, "targetPort": OPA_PORT}],
            },
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        # Registered last: only once the Deployment is ready (its readiness means the
        # policy is loaded).
        webhook = k8s.admissionregistration.v1.ValidatingWebhookConfiguration(
            f"{name}-webhook",
            metadata={"name": GATE_NAME, "labels": self._labels},
            webhooks=pulumi.Output.all(config, ca.cert_pem, service.metadata.name).apply(
                lambda v: [
                    webhook_spec(
                        config=v[0],
                        client_config={
                            "caBundle": base64.b64encode(v[1].encode()).decode(),
                            "service": {
                                "namespace": args.namespace,
                                "name": v[2],
                                "path": "/",
                                "port": 443,
                            },
                        },
                        gate_namespace=args.namespace,
                        failure_policy=args.failure_policy,
                        timeout_seconds=args.timeout_seconds,
                    )
                ]
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[deployment, service, *exclusions])
            ),
        )
        return ca.cert_pem, cert.validity_end_time, webhook.metadata.apply(lambda m: m.name)

    # ------------------------------------------------------------------ engine: native

    def _native(
        self, config: pulumi.Output[dict[str, Any]], exclusions: list[pulumi.Resource]
    ) -> pulumi.Output[str]:
        name, args, child = self._name, self._args, self._child
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=config.apply(
                lambda c: admission_policy_spec(
                    c, args.failure_policy, gate_namespace=args.namespace
                )
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=admission_policy_binding_spec(policy.metadata.name, gate_namespace=args.namespace),
            opts=child,
        )
        return binding.metadata.apply(lambda m: m.name)

    def _routing(
        self, config: pulumi.Output[dict[str, Any]], exclusions: list[pulumi.Resource]
    ) -> None:
        """Route GPU pods before the ValidatingAdmissionPolicy judges them."""
        name, args, child = self._name, self._args, self._child
        # admissionregistration.k8s.io/v1 (Kubernetes v1.36) is newer than the kubernetes SDK's
        # generated types, so the objects are declared by apiVersion and kind; the provider
        # applies them like any other kind.
        policy = k8s.apiextensions.CustomResource(
            f"{name}-routing",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicy",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=pulumi.Output.all(config, args.pool_toleration).apply(
                lambda v: routing_policy_spec(
                    v[0], v[1], args.failure_policy, gate_namespace=args.namespace
                )
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-routing-binding",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicyBinding",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=routing_binding_spec(
                policy.metadata.apply(lambda m: m["name"]), gate_namespace=args.namespace
            ),
            opts=child,
        )
