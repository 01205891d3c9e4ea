"""OpaGate: admission control that keeps GPU pods on the binpack scheduler.

It judges pod CREATEs that request or limit a GPU resource (components/gpu_resources.py: the
one definition the binpack scheduler weighs too; what the GPU Operator's settings advertise,
and the extended resources this stack advertises) or ask for devices through DRA
(spec.resourceClaims): unless spec.schedulerName is the binpack scheduler they are refused,
with a message naming the pod, the resource and the required scheduler. A container that sets
NVIDIA_VISIBLE_DEVICES (to anything but void or none) without requesting a GPU itself is
refused too: with the container toolkit's default it would reach every GPU of its node unseen
(GpuOperator also tells the toolkit to ignore the variable; the gate is for what the toolkit's
settings do not cover, privileged containers and a toolkit the stack does not install). That
rule also judges the ephemeral containers `kubectl debug` adds to a running pod (an UPDATE of
pods/ephemeralcontainers), which cannot request a GPU at all. Two kinds of pod are not judged:
a node's mirror pods of its static pods (they run whatever the gate says; refusing the mirror
only hides their GPUs from the scheduler), recognised exactly as NodeRestriction admits them,
and the GPU Operator's own pods (GpuOperatorSettings.operator_pods(): in its namespace,
created by its validator or by the DaemonSet controller for a DaemonSet), whether the stack
installs the operator or it runs outside the stack (admission.externalGpuOperatorNamespace).
Pool pods are judged like GPU pods: a pod being created, not bound to a node, with a toleration
that names the GPU pool taint's key, must be on the binpack scheduler too (routed, or refused),
so that one scheduler alone places pods on the pool's nodes; two schedulers binding to one
node each see room the other has just taken, and the kubelet then rejects a pod (OutOfcpu).
The DaemonSet controller's pods stay with the cluster's scheduler, and a toleration of every
taint (an empty key with Exists) does not make a pool pod (docs/layers.md, "Two schedulers,
one node").
The scheduler name, resource names, pool toleration and operator's pods are data handed over
from the layers that own them, never written into the policy source. Every GPU pod the gate
admits tolerates the GPU pool's taint, or the stack config is refused
(opa_gate_settings.pool_toleration_problem). Three engines:
- `mutating-admission-policy` (the default; Kubernetes v1.36+, where the API is GA): a
  MutatingAdmissionPolicy first routes GPU pods and pool pods that leave spec.schedulerName
  unset to the binpack scheduler and adds the GPU pool's toleration when no toleration of
  theirs covers the taint; the ValidatingAdmissionPolicy below then refuses only what cannot be routed (a
  scheduler of the pod's own, a preset spec.nodeName). No server, nothing to be down.
- `opa`: OPA 1.x behind a ValidatingWebhookConfiguration, with the Rego v1 policies from
  components/opa_gate/policies/ loaded at start-up from a mounted ConfigMap (GPU resource names and scheduler
  name reach them as data); nothing pushes policies at run time, so a restarted OPA is
  ready as soon as it has read its files. A CA and serving certificate from pulumi-tls (kept
  in state, renewed in the last 30 days of the serving certificate). Only pods that request a
  gated resource, pool pods and pods that mention NVIDIA_VISIBLE_DEVICES, and ephemeral
  containers added with the variable, are sent to OPA (matchConditions). GPU pods get the pool's toleration only from
  the API server's ExtendedResourceToleration plugin (controlPlane.admissionPlugins).
- `validating-admission-policy`: a native ValidatingAdmissionPolicy (CEL, GA since 1.30)
  with the same rule and message as OPA's; no webhook server at all. Tolerations as with `opa`.
The native policies' rules are static (components/opa_gate/policies/gpu_scheduler.cel.yaml) and the gate data is
written into them, so no object in the cluster that could be edited or deleted holds it; OPA
reads the same document as data.gpu_cluster.config from an immutable ConfigMap.
DRA mode (device_classes, gpuOperator.allocation dra): a resource claim is a GPU request only
when the ResourceClaimTemplate or ResourceClaim it names selects a GPU DeviceClass. The native
engines add a policy pair per kind whose parameters are those objects in the pod's namespace
(the API server looks them up; the gate data is written into them); the stack config refuses
`opa` with DRA, as OPA cannot see them (components/opa_gate/policies/README.md, "DRA claims"). And whatever reached
another scheduler, a parameter-free policy on resourceclaims/status lets only the stack's
scheduler (`allocator`, its ServiceAccount's username) allocate a device of a GPU driver.
The stack's PriorityClasses (priority_classes, from GpuPriorityClasses) may preempt other
pods: every engine refuses a pod being created that names one but asks for no GPU, unless its
namespace is one of priority_class_namespaces (priorityClasses.allowedNamespaces). In DRA mode
a resource claim counts for that rule only once the pod is on the binpack scheduler (where the
claim routing policy puts a GPU claim's pod).

This module turns the objects of components/opa_gate/manifests.py into resources and wires
them (the settings are components/opa_gate/settings.py); the TLS material, Pulumi state, is
made here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Self

import pulumi
import pulumi_kubernetes as k8s
import pulumi_tls as tls
from pydantic import Field, model_validator

from components.cluster_access import ClusterAccess, ClusterLayer
from components.handoffs import OperatorPods
from components.opa_gate.manifests import (
    ALLOCATION_POLICY,
    CLAIM_KINDS,
    GATE_CONFIG_FILE,
    GATE_CONFIGMAP,
    OPA_NAME,
    OPA_POLICIES_CONFIGMAP,
    OPA_SELECTOR,
    OPA_SERVING_SECRET,
    admission_policy_binding_spec,
    admission_policy_spec,
    allocation_binding_spec,
    allocation_policy_spec,
    claim_binding_spec,
    claim_policy_name,
    claim_policy_spec,
    claim_routing_binding_spec,
    claim_routing_policy_spec,
    gate_config_json,
    gate_data,
    gate_metadata,
    inputs_checksum,
    opa_deployment_spec,
    opa_disruption_budget,
    opa_pod_spec,
    opa_service_spec,
    policy_files,
    routing_binding_spec,
    routing_policy_spec,
    serving_dns_names,
    webhook_client_config,
    webhook_spec,
)
from components.opa_gate.settings import (
    DEFAULT_GATE_NAMESPACE,
    GATE_NAME,
    ROUTING_ENGINE,
    OpaGateSettings,
    claim_lookup_problem,
    load_policies,
)
from components.settings import PROJECT, Runtime, problem

TOKEN = f"{PROJECT}:index:OpaGate"


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
    """The GPU Operator's own pods (GpuOperatorSettings.operator_pods(), of the stack's operator
    or of the one external_gpu_operator_namespace names), let through; None without either."""
    pool_toleration: Annotated[
        pulumi.Output[dict[str, str]] | Mapping[str, str] | None, Runtime()
    ] = None
    """The GPU pool's toleration (TaintedGpuPool's output): the routing engine adds it to
    routed GPU pods that lack it, and every engine keeps the pods that tolerate the pool's
    taint (pool pods, not the DaemonSet controller's) on the scheduler like GPU pods. None:
    neither."""
    pool_nodes: Annotated[pulumi.Output[list[str]] | Sequence[str], Runtime()] = ()
    """The GPU pool's nodes (TaintedGpuPool's output): with pool_toleration, a pod that asks
    for no GPU may be bound to one, or tolerate the pool's taint, only in pool_namespaces or
    as a pod of pool_daemon_sets."""
    gang_pods: Annotated[bool, Runtime()] = False
    """Whether the stack's scheduler places gangs (scheduler.gangScheduling): every pod of a
    PodGroup is then kept on it, GPU or not."""
    gang_namespaces: Annotated[Sequence[str], Runtime()] = ()
    """With gang_pods, the namespaces whose PodGroups are kept on the stack's scheduler
    (scheduler.gangNamespaces); empty: every namespace."""
    device_classes: Annotated[Sequence[str], Runtime()] = ()
    """The DeviceClasses whose resource claims are GPU requests (GpuOperator's
    device_classes(), DRA mode): a pod's claim counts only when the ResourceClaimTemplate or
    ResourceClaim it names selects one of them, looked up by the claim policies of the native
    engines. Empty (device-plugin mode): every claim counts."""
    device_drivers: Annotated[Sequence[str], Runtime()] = ()
    """The DRA drivers whose devices are GPUs (GpuOperator's device_drivers(), DRA mode): only
    `allocator` may allocate their devices."""
    allocator: Annotated[pulumi.Output[str] | str | None, Runtime()] = None
    """The username of the stack's scheduler (BinpackScheduler's identity): in DRA mode the one
    identity that may write an allocation of a GPU driver's devices."""
    priority_classes: Annotated[Sequence[str], Runtime()] = ()
    """The stack's PriorityClasses (GpuPriorityClasses' class names, when the layer is on):
    a pod being created may name one only when it asks for a GPU, or in one of
    priority_class_namespaces. Empty: no PriorityClass is judged."""
    priority_class_namespaces: Annotated[Sequence[str], Runtime()] = ()
    """Namespaces whose pods may name priority_classes without asking for a GPU
    (priorityClasses.allowedNamespaces)."""
    namespace: Annotated[str, Runtime()] = DEFAULT_GATE_NAMESPACE
    """The gate's own namespace (created, and excluded from the gate)."""
    opa_image: Annotated[str, Runtime()] = "openpolicyagent/opa:1.22.2"
    """OPA 1.x image."""
    policies: Annotated[Mapping[str, str], Runtime()] = Field(default_factory=load_policies)
    """{name: Rego source}; defaults to components/opa_gate/policies/*.rego without tests."""

    @model_validator(mode="after")
    def _engine_can_look_up_claims(self) -> Self:
        """With device_classes (DRA) the engine must look up what a pod's claims name."""
        found = claim_lookup_problem(engine=self.engine, device_classes=self.device_classes)
        if found is not None:
            raise problem(found.allowed, key=found.key, value=found.value)
        return self

    @model_validator(mode="after")
    def _dra_has_an_allocator(self) -> Self:
        """DRA mode names the GPU drivers and the one identity that allocates their devices."""
        if self.device_classes and (not self.device_drivers or self.allocator is None):
            raise ValueError(
                "device_classes (DRA mode) need device_drivers and allocator: the gate lets "
                "only the stack's scheduler allocate GPU devices"
            )
        return self


class OpaGate(ClusterLayer):
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
        super().__init__(TOKEN, name, args.access, opts)
        self._args = args

        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace", metadata=gate_metadata(args.namespace), opts=self.children
        )
        # The namespaces the gate excludes exist before any gate object does.
        self._exclusions: list[pulumi.Resource] = [namespace]
        self._after_exclusions = pulumi.ResourceOptions.merge(
            self.children, pulumi.ResourceOptions(depends_on=self._exclusions)
        )
        config = self._gate_data()
        if args.engine == "opa":
            ca_pem, not_after, policy_name = self._opa(config)
        else:
            ca_pem = not_after = pulumi.Output.from_input("")
            policy_name = self._native(config)
            if args.engine == ROUTING_ENGINE:
                self._routing(config)
            for kind in CLAIM_KINDS if args.device_classes else ():
                self._claims(kind, config)
            if args.device_classes:
                self._allocations()

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

    def _gate_data(self) -> pulumi.Output[dict[str, str]]:
        """gate_data() of the scheduler's name, every resource the settings gate, the pool's
        toleration and nodes (which pods are pool pods, and where pods without a GPU may
        not run)."""
        args = self._args
        gated = args.gpu_resources if args.gate_extended_resources else ()
        return pulumi.Output.all(
            args.scheduler_name, gated, args.pool_toleration, args.pool_nodes
        ).apply(
            lambda v: gate_data(
                v[0],
                [*args.device_resources, *v[1]],
                args.gpu_resource_prefixes,
                operator_pods=args.operator_pods,
                pool_toleration=v[2],
                pool_nodes=v[3],
                pool_namespaces=args.pool_namespaces,
                pool_daemonsets=args.pool_daemon_sets,
                gang_pods=args.gang_pods,
                gang_namespaces=args.gang_namespaces,
                device_classes=args.device_classes,
                priority_classes=args.priority_classes,
                priority_class_namespaces=args.priority_class_namespaces,
            )
        )

    def _meta(self, name: str) -> dict[str, Any]:
        return gate_metadata(name, self._args.namespace)

    # ------------------------------------------------------------------ engine: opa

    def _opa(
        self, config: pulumi.Output[dict[str, Any]]
    ) -> tuple[pulumi.Output[str], pulumi.Output[str], pulumi.Output[str]]:
        """OPA behind a webhook: certificates, OPA's files and pods, its Service, the webhook."""
        key, ca, cert = self._certificates(OPA_NAME)
        pod_spec = self._opa_pod(config, key, cert)
        deployment = self._opa_deployment(config, cert, pod_spec)
        service = k8s.core.v1.Service(
            f"{self.pulumi_resource_name}-service",
            metadata=self._meta(OPA_NAME),
            spec=opa_service_spec(),
            opts=self._after_exclusions,
        )
        webhook = self._webhook(config, ca, service, deployment)
        return ca.cert_pem, cert.validity_end_time, webhook.metadata.apply(lambda m: m.name)

    def _certificates(
        self, service: str
    ) -> tuple[tls.PrivateKey, tls.SelfSignedCert, tls.LocallySignedCert]:
        """CA and serving certificate, kept in state: no new certificate on each up."""
        name, ns = self.pulumi_resource_name, self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        ca_key = tls.PrivateKey(f"{name}-ca-key", algorithm="ECDSA", ecdsa_curve="P256", opts=child)
        ca = tls.SelfSignedCert(
            f"{name}-ca",
            private_key_pem=ca_key.private_key_pem,
            is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name=f"{PROJECT} admission CA"),
            validity_period_hours=10 * 365 * 24,
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            opts=child,
        )
        key = tls.PrivateKey(
            f"{name}-serving-key", algorithm="ECDSA", ecdsa_curve="P256", opts=child
        )
        dns_names = serving_dns_names(service, ns)
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

    def _opa_pod(
        self,
        config: pulumi.Output[dict[str, Any]],
        key: tls.PrivateKey,
        cert: tls.LocallySignedCert,
    ) -> dict[str, Any]:
        """OPA's pod spec, once what it mounts and runs as exists."""
        name, args, after = self.pulumi_resource_name, self._args, self._after_exclusions
        serving = k8s.core.v1.Secret(
            f"{name}-serving",
            metadata=self._meta(OPA_SERVING_SECRET),
            type="kubernetes.io/tls",
            string_data={"tls.crt": cert.cert_pem, "tls.key": key.private_key_pem},
            opts=after,
        )
        # What OPA decides by is immutable: the API server refuses an edit, so only a deletion
        # (OPA pods that restart then cannot start, and GPU pods are refused) or the stack's
        # own replacement changes it; a new value replaces the object and rolls OPA.
        # Ref: https://kubernetes.io/docs/concepts/configuration/configmap/#configmap-immutable
        replaced = pulumi.ResourceOptions.merge(
            after, pulumi.ResourceOptions(replace_on_changes=["data"], delete_before_replace=True)
        )
        policies = k8s.core.v1.ConfigMap(
            f"{name}-policies",
            metadata=self._meta(OPA_POLICIES_CONFIGMAP),
            data=policy_files(args.policies),
            immutable=True,
            opts=replaced,
        )
        gate_config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=self._meta(GATE_CONFIGMAP),
            data={GATE_CONFIG_FILE: config.apply(gate_config_json)},
            immutable=True,
            opts=replaced,
        )
        # OPA reads only its mounted files: its identity needs no API access and no token.
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=self._meta(OPA_NAME),
            automount_service_account_token=False,
            opts=after,
        )
        return opa_pod_spec(
            args.opa_image,
            service_account=account.metadata.name,
            serving_secret=serving.metadata.name,
            policies_configmap=policies.metadata.name,
            config_configmap=gate_config.metadata.name,
        )

    def _opa_deployment(
        self,
        config: pulumi.Output[dict[str, Any]],
        cert: tls.LocallySignedCert,
        pod_spec: dict[str, Any],
    ) -> k8s.apps.v1.Deployment:
        """OPA's Deployment, rolled by a change of what it reads, and its disruption budget."""
        name, args, after = self.pulumi_resource_name, self._args, self._after_exclusions
        checksum = pulumi.Output.all(cert.cert_pem, config, policy_files(args.policies)).apply(
            lambda v: inputs_checksum(v[0], v[1], v[2])
        )
        deployment = k8s.apps.v1.Deployment(
            f"{name}-opa",
            metadata=self._meta(OPA_NAME),
            spec=opa_deployment_spec(args.replicas, pod_spec, checksum),
            opts=after,
        )
        budget = opa_disruption_budget(args.replicas, OPA_SELECTOR)
        if budget is not None:
            k8s.policy.v1.PodDisruptionBudget(
                f"{name}-opa-budget", metadata=self._meta(OPA_NAME), spec=budget, opts=after
            )
        return deployment

    def _webhook(
        self,
        config: pulumi.Output[dict[str, Any]],
        ca: tls.SelfSignedCert,
        service: k8s.core.v1.Service,
        deployment: k8s.apps.v1.Deployment,
    ) -> k8s.admissionregistration.v1.ValidatingWebhookConfiguration:
        """The webhook, registered last: only once the Deployment is ready (its readiness
        means the policy is loaded)."""
        args = self._args
        return k8s.admissionregistration.v1.ValidatingWebhookConfiguration(
            f"{self.pulumi_resource_name}-webhook",
            metadata=gate_metadata(GATE_NAME),
            webhooks=pulumi.Output.all(config, ca.cert_pem, service.metadata.name).apply(
                lambda v: [
                    webhook_spec(
                        config=v[0],
                        client_config=webhook_client_config(v[1], args.namespace, v[2]),
                        gate_namespace=args.namespace,
                        failure_policy=args.failure_policy,
                        timeout_seconds=args.timeout_seconds,
                    )
                ]
            ),
            opts=pulumi.ResourceOptions.merge(
                self.children,
                pulumi.ResourceOptions(depends_on=[deployment, service, *self._exclusions]),
            ),
        )

    # ------------------------------------------------------------------ engine: native

    def _native(self, config: pulumi.Output[dict[str, Any]]) -> pulumi.Output[str]:
        """The ValidatingAdmissionPolicy and its binding: refuse GPU pods off the scheduler. The
        gate data is written into the policy, so a change of it updates the policy."""
        name, args = self.pulumi_resource_name, self._args
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy",
            metadata=gate_metadata(GATE_NAME),
            spec=config.apply(
                lambda c: admission_policy_spec(
                    c, args.failure_policy, gate_namespace=args.namespace
                )
            ),
            opts=self._after_exclusions,
        )
        binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata=gate_metadata(GATE_NAME),
            spec=admission_policy_binding_spec(policy.metadata.name, gate_namespace=args.namespace),
            opts=self.children,
        )
        return binding.metadata.apply(lambda m: m.name)

    def _routing(self, config: pulumi.Output[dict[str, Any]]) -> None:
        """Route GPU pods before the ValidatingAdmissionPolicy judges them."""
        name, args = self.pulumi_resource_name, self._args
        # admissionregistration.k8s.io/v1 (Kubernetes v1.36) is newer than the kubernetes SDK's
        # generated types, so the objects are declared by apiVersion and kind; the provider
        # applies them like any other kind.
        policy = k8s.apiextensions.CustomResource(
            f"{name}-routing",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicy",
            metadata=gate_metadata(GATE_NAME),
            spec=config.apply(
                lambda c: routing_policy_spec(c, args.failure_policy, gate_namespace=args.namespace)
            ),
            opts=self._after_exclusions,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-routing-binding",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicyBinding",
            metadata=gate_metadata(GATE_NAME),
            spec=routing_binding_spec(
                policy.metadata.apply(lambda m: m["name"]), gate_namespace=args.namespace
            ),
            opts=self.children,
        )

    def _allocations(self) -> None:
        """DRA mode: only the stack's scheduler allocates GPU devices, whatever reached another
        scheduler (components/opa_gate/policies/gpu_scheduler.cel.yaml, `allocations`). No parameter object: the
        scheduler's identity and name and the GPU drivers are written into the policy."""
        name, args = self.pulumi_resource_name, self._args
        operator = args.operator_pods.namespace if args.operator_pods is not None else ""
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-allocations-policy",
            metadata=gate_metadata(ALLOCATION_POLICY),
            spec=pulumi.Output.all(args.allocator, args.scheduler_name).apply(
                lambda v: allocation_policy_spec(
                    allocator=v[0],
                    scheduler_name=v[1],
                    drivers=args.device_drivers,
                    failure_policy=args.failure_policy,
                    gate_namespace=args.namespace,
                    operator_namespace=operator,
                )
            ),
            opts=self._after_exclusions,
        )
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-allocations-binding",
            metadata=gate_metadata(ALLOCATION_POLICY),
            spec=allocation_binding_spec(
                policy.metadata.name, gate_namespace=args.namespace, operator_namespace=operator
            ),
            opts=self.children,
        )

    def _claims(self, kind: str, config: pulumi.Output[dict[str, Any]]) -> None:
        """DRA mode: the claim policies for `kind`, which judge a pod's claims by the object
        they name (each object of the kind in the pod's namespace a parameter, read by the API
        server itself: no RBAC of the stack's). The parameter document is written in, so a
        change of it updates these policies."""
        name, args = self.pulumi_resource_name, self._args
        child = f"{name}-{kind.lower()}s"
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{child}-policy",
            metadata=gate_metadata(claim_policy_name(kind)),
            spec=config.apply(lambda c: claim_policy_spec(kind, c, gate_namespace=args.namespace)),
            opts=self._after_exclusions,
        )
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{child}-binding",
            metadata=gate_metadata(claim_policy_name(kind)),
            spec=claim_binding_spec(policy.metadata.name, gate_namespace=args.namespace),
            opts=self.children,
        )
        if args.engine != ROUTING_ENGINE:
            return
        routing = k8s.apiextensions.CustomResource(
            f"{child}-routing",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicy",
            metadata=gate_metadata(claim_policy_name(kind)),
            spec=config.apply(
                lambda c: claim_routing_policy_spec(kind, c, gate_namespace=args.namespace)
            ),
            opts=self._after_exclusions,
        )
        k8s.apiextensions.CustomResource(
            f"{child}-routing-binding",
            api_version="admissionregistration.k8s.io/v1",
            kind="MutatingAdmissionPolicyBinding",
            metadata=gate_metadata(claim_policy_name(kind)),
            spec=claim_routing_binding_spec(
                routing.metadata.apply(lambda m: m["name"]), gate_namespace=args.namespace
            ),
            opts=self.children,
        )
