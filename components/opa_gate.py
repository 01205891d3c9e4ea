"""OpaGate: admission control that rejects GPU pods not using the binpack scheduler.

It rejects pod CREATEs that request or limit a GPU resource (nvidia.com/gpu, nvidia.com/mig-*,
and the extended resources this stack advertises) unless spec.schedulerName is the binpack
scheduler; the message names the pod, the resource and the required scheduler. The scheduler
name and resource names are data handed over from the layers that own them, never written into
the policy source. Two engines, one rule and one message:
- `opa`: OPA 1.x + kube-mgmt behind a ValidatingWebhookConfiguration, with the Rego v1
  policies from policies/. A CA and serving certificate from pulumi-tls (kept in state, renewed
  in the last 30 days of the serving certificate); kube-mgmt loads the policy ConfigMaps through
  a management listener on 127.0.0.1 guarded by a bearer token (policies/authz.rego: anonymous
  callers may only ask for the decision and read /health). The readiness probe is /health/ready
  (policies/health.rego: ready once the GPU policy and its data are loaded), and the webhook is
  created only after the Deployment is ready, so the API server never meets an empty OPA. RBAC:
  one Role on ConfigMaps in the gate's namespace.
- `validating-admission-policy`: a native ValidatingAdmissionPolicy (CEL, GA since 1.30)
  with the same data written into its CEL; no webhook server at all.

The module-level functions build what both the component and the live tests create
(webhook, OPA arguments, policy ConfigMaps, the policy and its binding): one source of truth.

Either way kube-system and the gate's own namespace carry openpolicyagent.org/webhook=ignore
and are excluded, so the gate can never stop the cluster from restarting the gate itself.

failurePolicy: `Fail` means no GPU pod is admitted while the gate cannot answer (OPA down,
timeout), so bin-packing is never bypassed, and the excluded namespaces let the cluster and the
gate recover. CPU pods are evaluated too (the webhook cannot tell GPU pods from others before
asking), so with `Fail` an OPA outage also blocks CPU pods in gated namespaces: run 2 replicas.
`Ignore` keeps every workload flowing during an outage at the price of GPU pods possibly landing
on the default scheduler meanwhile. The native engine has no server to fail, so its failure
policy only matters for CEL evaluation errors.
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
from components.settings import BOOL, Runtime, Settings, between, choice

TOKEN = "gpu-cluster:index:OpaGate"

AdmissionEngine = Literal["opa", "validating-admission-policy"]
ADMISSION_ENGINES: tuple[AdmissionEngine, ...] = get_args(AdmissionEngine)
FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = get_args(FailurePolicy)

POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
# Loaded by OPA at start-up from a mounted ConfigMap: who may call OPA, and when it is ready.
STARTUP_POLICIES = ("authz", "health")
IGNORE_LABEL = "openpolicyagent.org/webhook"
OPA_PORT = 8443
MGMT_PORT = 8181
# Always gated, whatever the config adds: whole GPUs and MIG profiles.
BASE_GPU_RESOURCES = ("nvidia.com/gpu",)
BASE_GPU_PREFIXES = ("nvidia.com/mig-",)
# Name of the ValidatingWebhookConfiguration, ValidatingAdmissionPolicy and its binding.
GATE_NAME = "gpu-scheduler-gate"
WEBHOOK_NAME = "gpu-scheduler.gpu-cluster.io"
GATE_CONFIG_FILE = "gate.json"
MGMT_TOKEN_FILE = "token"
MGMT_TOKEN_DATA_FILE = "token.json"


def load_policies(directory: Path = POLICY_DIR) -> dict[str, str]:
    """{file stem: Rego source} of the policies in `directory`, tests excluded."""
    return {
        path.stem: path.read_text()
        for path in sorted(directory.glob("*.rego"))
        if not path.stem.endswith("_test")
    }


def gate_data(
    scheduler_name: str, resources: Sequence[str], prefixes: Sequence[str]
) -> dict[str, Any]:
    """The policies' data document, data.gpu_cluster.config (see policies/README.md)."""
    return {
        "scheduler_name": scheduler_name,
        "gpu_resources": sorted({*BASE_GPU_RESOURCES, *resources}),
        "gpu_resource_prefixes": sorted({*BASE_GPU_PREFIXES, *prefixes}),
    }


def ignore_selector() -> dict[str, Any]:
    """Namespace selector of both engines: every namespace not labelled ignore."""
    return {"matchExpressions": [{"key": IGNORE_LABEL, "operator": "NotIn", "values": ["ignore"]}]}


def startup_policies(policies: Mapping[str, str]) -> dict[str, str]:
    """{file name: source} OPA loads from its start-up directory: authz and health."""
    return {f"{stem}.rego": policies[stem] for stem in STARTUP_POLICIES if stem in policies}


def policy_config_maps(policies: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """{ConfigMap name: data} of the policies kube-mgmt loads into OPA (one per policy)."""
    return {
        f"policy-{stem.replace('_', '-')}": {f"{stem}.rego": source}
        for stem, source in policies.items()
        if stem not in STARTUP_POLICIES
    }


def mgmt_token_data(token: str) -> dict[str, str]:
    """The management token Secret's files: raw for kube-mgmt, JSON for OPA's data."""
    return {MGMT_TOKEN_FILE: token, MGMT_TOKEN_DATA_FILE: json.dumps({"token": token})}


def opa_run_args(
    *,
    https_addr: str = f"0.0.0.0:{OPA_PORT}",
    mgmt_addr: str = f"127.0.0.1:{MGMT_PORT}",
    certs_dir: str = "/certs",
    startup_dir: str = "/startup",
    config_dir: str = "/config",
    mgmt_dir: str = "/mgmt",
) -> list[str]:
    """`opa` arguments: HTTPS for the API server, token-guarded management on loopback.

    The directories hold the serving Secret (tls.crt, tls.key), startup_policies(),
    the gate data (gate.json) and mgmt_token_data(); OPA reads them at start.
    """
    return [
        "run",
        "--server",
        f"--addr=https://{https_addr}",
        # Management API for kube-mgmt: loopback only, and token-protected.
        f"--addr=http://{mgmt_addr}",
        f"--tls-cert-file={certs_dir}/tls.crt",
        f"--tls-private-key-file={certs_dir}/tls.key",
        "--authentication=token",
        "--authorization=basic",
        "--skip-version-check",
        "--log-format=json",
        startup_dir,
        f"gpu_cluster.config:{config_dir}/{GATE_CONFIG_FILE}",
        f"gpu_cluster.mgmt:{mgmt_dir}/{MGMT_TOKEN_DATA_FILE}",
    ]


def webhook_spec(
    *,
    client_config: Mapping[str, Any],
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration's one webhook; OPA answers at path `/`."""
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        # Also makes the API server call the gate for dry-run requests.
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "matchPolicy": "Equivalent",
        "namespaceSelector": ignore_selector(),
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "clientConfig": dict(client_config),
    }


def _cel_literal(value: str | Sequence[str]) -> str:
    # JSON strings and lists of strings are valid CEL literals.
    return json.dumps(value if isinstance(value, str) else list(value))


def _cel_gpu_names(section: str) -> str:
    """CEL: the GPU resources container `c` asks for in `section`, quantity above zero."""
    return (
        f"(has(c.resources.{section}) ? c.resources.{section}.filter(r,"
        " (r in variables.gpuResources || variables.gpuPrefixes.exists(p, r.startsWith(p)))"
        f" && quantity(string(c.resources.{section}[r])).isGreaterThan(quantity('0'))) : [])"
    )


# The smallest string of a non-empty list L, in CEL (no sort() in the API server's CEL).
_CEL_SMALLEST = "{l}.filter(x, {l}.all(y, x <= y))[0]"


def admission_policy_spec(
    config: Mapping[str, Any], failure_policy: FailurePolicy = "Fail"
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: policies/gpu_scheduler.rego's rule and message in CEL.

    `config` is gate_data(); it is written into the CEL as literals rather than read from a
    parameter object, because a binding whose parameter is missing denies every request it
    matches, CPU pods included, and a ConfigMap could drop the always-gated nvidia.com/gpu.
    With several kinds of GPU resource the message names the alphabetically first, which is
    the first of the Rego policy's (sorted) messages.
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/
    """
    variables = {
        "gpuResources": _cel_literal(config["gpu_resources"]),
        "gpuPrefixes": _cel_literal([p for p in config["gpu_resource_prefixes"] if p]),
        "requiredScheduler": _cel_literal(config["scheduler_name"]),
        "containers": "object.spec.containers"
        " + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
        " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])",
        "gpuByContainer": "variables.containers.map(c, !has(c.resources) ? [] : "
        + _cel_gpu_names("requests")
        + " + "
        + _cel_gpu_names("limits")
        + ")",
        # The first GPU resource (by name) of each container asking for one.
        "gpuNames": "variables.gpuByContainer.filter(l, size(l) > 0)"
        ".map(l, " + _CEL_SMALLEST.format(l="l") + ")",
        "podName": "(has(object.metadata.namespace) && object.metadata.namespace != ''"
        " ? object.metadata.namespace : request.namespace) + '/'"
        " + (has(object.metadata.name) && object.metadata.name != ''"
        " ? object.metadata.name : (has(object.metadata.generateName)"
        " ? object.metadata.generateName : '<unnamed>'))",
        "schedulerShown": "has(object.spec.schedulerName)"
        " ? '\"' + object.spec.schedulerName + '\"' : 'unset'",
    }
    return {
        "failurePolicy": failure_policy,
        "matchConstraints": {
            "namespaceSelector": ignore_selector(),
            "resourceRules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
        },
        "variables": [{"name": n, "expression": e} for n, e in variables.items()],
        "validations": [
            {
                "expression": "size(variables.gpuNames) == 0"
                " || (has(object.spec.schedulerName)"
                " && object.spec.schedulerName == variables.requiredScheduler)",
                "messageExpression": "'pod \"' + variables.podName + '\" requests '"
                " + "
                + _CEL_SMALLEST.format(l="variables.gpuNames")
                + " + ' but spec.schedulerName is ' + variables.schedulerShown"
                " + '; GPU pods must set spec.schedulerName: ' + variables.requiredScheduler",
                "reason": "Forbidden",
            }
        ],
    }


def admission_policy_binding_spec(policy_name: Any = GATE_NAME) -> dict[str, Any]:
    """The binding: enforce (Deny) everywhere but in namespaces labelled ignore."""
    return {
        "policyName": policy_name,
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": ignore_selector()},
    }


class OpaGateSettings(Settings):
    """The gate that keeps GPU pods on the binpack scheduler (the stack config's admission)."""

    engine: Annotated[AdmissionEngine, choice(ADMISSION_ENGINES)] = "opa"
    """`opa` (webhook) or `validating-admission-policy` (native CEL, no webhook server)."""
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
    gpu_resource_prefixes: Annotated[Sequence[str], Runtime()] = ()
    """Extra resource name prefixes to gate (nvidia.com/mig- is always gated)."""
    namespace: Annotated[str, Runtime()] = "gpu-admission"
    """The gate's own namespace (created, and excluded from the gate)."""
    opa_image: Annotated[str, Runtime()] = "openpolicyagent/opa:1.22.2"
    """OPA 1.x image."""
    kube_mgmt_image: Annotated[str, Runtime()] = "openpolicyagent/kube-mgmt:9.3.0"
    """kube-mgmt sidecar image (a major that supports OPA 1.x)."""
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
            metadata={"name": args.namespace, "labels": {**self._labels, IGNORE_LABEL: "ignore"}},
            opts=self._child,
        )
        # Server-side apply owns just this label; destroy removes only it.
        kube_system = k8s.core.v1.NamespacePatch(
            f"{name}-kube-system-label",
            metadata={"name": "kube-system", "labels": {IGNORE_LABEL: "ignore"}},
            opts=self._child,
        )
        gated = args.gpu_resources if args.gate_extended_resources else ()
        config = pulumi.Output.all(args.scheduler_name, gated).apply(
            lambda v: gate_data(v[0], v[1], args.gpu_resource_prefixes)
        )
        exclusions: list[pulumi.Resource] = [namespace, kube_system]
        if args.engine == "opa":
            ca_pem, policy_name = self._opa(config, exclusions)
        else:
            ca_pem = pulumi.Output.from_input("")
            policy_name = self._native(config, exclusions)

        self.engine = pulumi.Output.from_input(args.engine)
        self.namespace = namespace.metadata.apply(lambda _: args.namespace)
        self.ca_cert_pem = ca_pem
        self.policy_name = policy_name
        self.register_outputs(
            {
                "engine": self.engine,
                "namespace": self.namespace,
                "ca_cert_pem": self.ca_cert_pem,
                "policy_name": self.policy_name,
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
    ) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
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
        # Bearer token for the management API: random bytes held (as a secret) in state,
        # derived from a key pair so no extra provider is needed; stable across runs.
        token_key = tls.PrivateKey(
            f"{name}-mgmt-token", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
        )
        token = token_key.private_key_pem.apply(
            lambda pem: hashlib.sha256(pem.encode()).hexdigest()
        )
        mgmt = k8s.core.v1.Secret(
            f"{name}-mgmt-token",
            metadata=self._meta("opa-mgmt-token"),
            string_data=token.apply(mgmt_token_data),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        startup = k8s.core.v1.ConfigMap(
            f"{name}-startup-policies",
            metadata=self._meta("opa-startup-policies"),
            data=startup_policies(args.policies),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        gate_config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=self._meta("gpu-gate-config"),
            data={GATE_CONFIG_FILE: config.apply(lambda c: json.dumps(c, sort_keys=True))},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        # kube-mgmt loads every ConfigMap in the namespace with this label into OPA.
        policy_maps = [
            k8s.core.v1.ConfigMap(
                f"{name}-{map_name}",
                metadata=self._meta(
                    map_name, labels={**self._labels, "openpolicyagent.org/policy": "rego"}
                ),
                data=data,
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=exclusions)
                ),
            )
            for map_name, data in policy_config_maps(args.policies).items()
        ]
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=self._meta("opa"),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        # kube-mgmt reads the policy ConfigMaps and writes their status annotation; that is all.
        role = k8s.rbac.v1.Role(
            f"{name}-kube-mgmt",
            metadata=self._meta("opa-kube-mgmt"),
            rules=[
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["get", "list", "watch", "update", "patch"],
                }
            ],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-kube-mgmt",
            metadata=self._meta("opa-kube-mgmt"),
            role_ref={
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": role.metadata.name,
            },
            subjects=[
                {
                    "kind": "ServiceAccount",
                    "name": account.metadata.name,
                    "namespace": args.namespace,
                }
            ],
            opts=child,
        )
        selector = {"app.kubernetes.io/name": "opa"}
        https = {"scheme": "HTTPS", "port": OPA_PORT}
        pod_spec: Any = {
            "serviceAccountName": account.metadata.name,
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
                        {"name": "startup", "mountPath": "/startup", "readOnly": True},
                        {"name": "config", "mountPath": "/config", "readOnly": True},
                        {"name": "mgmt", "mountPath": "/mgmt", "readOnly": True},
                    ],
                },
                {
                    "name": "kube-mgmt",
                    "image": args.kube_mgmt_image,
                    "args": [
                        f"--opa-url=http://127.0.0.1:{MGMT_PORT}/v1",
                        f"--opa-auth-token-file=/mgmt/{MGMT_TOKEN_FILE}",
                        f"--namespaces={args.namespace}",
                        "--enable-policies=true",
                        "--enable-data=false",
                        "--require-policy-label=true",
                    ],
                    "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "mgmt", "mountPath": "/mgmt", "readOnly": True}],
                },
            ],
            "volumes": [
                {"name": "certs", "secret": {"secretName": serving.metadata.name}},
                {"name": "startup", "configMap": {"name": startup.metadata.name}},
                {"name": "config", "configMap": {"name": gate_config.metadata.name}},
                {"name": "mgmt", "secret": {"secretName": mgmt.metadata.name}},
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
                        # New certificates or config restart OPA (it reads them at start).
                        "annotations": {
                            "gpu-cluster.io/inputs-sha256": pulumi.Output.all(
                                cert.cert_pem, config
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
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[binding, *policy_maps])
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
        # policy is loaded) and both excluded namespaces carry the ignore label.
        webhook = k8s.admissionregistration.v1.ValidatingWebhookConfiguration(
            f"{name}-webhook",
            metadata={"name": GATE_NAME, "labels": self._labels},
            webhooks=[
                webhook_spec(
                    client_config={
                        "caBundle": ca.cert_pem.apply(
                            lambda pem: base64.b64encode(pem.encode()).decode()
                        ),
                        "service": {
                            "namespace": args.namespace,
                            "name": service.metadata.name,
                            "path": "/",
                            "port": 443,
                        },
                    },
                    failure_policy=args.failure_policy,
                    timeout_seconds=args.timeout_seconds,
                )
            ],
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[deployment, service, *exclusions])
            ),
        )
        return ca.cert_pem, webhook.metadata.apply(lambda m: m.name)

    # ------------------------------------------------------------------ engine: native

    def _native(
        self, config: pulumi.Output[dict[str, Any]], exclusions: list[pulumi.Resource]
    ) -> pulumi.Output[str]:
        name, args, child = self._name, self._args, self._child
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=config.apply(lambda c: admission_policy_spec(c, args.failure_policy)),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=exclusions)),
        )
        binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata={"name": GATE_NAME, "labels": self._labels},
            spec=admission_policy_binding_spec(policy.metadata.name),
            opts=child,
        )
        return binding.metadata.apply(lambda m: m.name)
