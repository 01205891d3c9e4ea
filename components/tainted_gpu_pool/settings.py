"""The gpuPool section of the stack config: TaintedGpuPool's settings (the nodes, their taint
and labels)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from components.gpu_resources import WHOLE_GPU
from components.kubernetes_names import (
    LABEL_KEY,
    LABEL_VALUE,
    QUALIFIED_NAME,
    NodeRefs,
    is_label_value,
    is_qualified_name,
)
from components.settings import PROJECT, Rule, Settings, problem, text

# GPU pods tolerate the pool's taint through the API server's ExtendedResourceToleration
# admission plugin, which adds `{key: <requested resource>, operator: Exists, effect:
# NoSchedule}` and nothing for NoExecute. A NoExecute pool would keep every GPU pod Pending
# and evict what runs on the nodes without its own toleration (device plugin, node exporter,
# CSI and logging agents), so it is refused rather than documented.
TaintEffect = Literal["NoSchedule", "PreferNoSchedule"]
TAINT_EFFECTS: tuple[TaintEffect, ...] = get_args(TaintEffect)
TAINT_EFFECT = Rule(
    f"allowed: {', '.join(TAINT_EFFECTS)} (not NoExecute: ExtendedResourceToleration gives GPU "
    "pods only NoSchedule tolerations, so they would stay Pending, and the taint would evict "
    "the node's agents)",
    lambda v: isinstance(v, str) and v in TAINT_EFFECTS,
)
DEFAULT_LABELS: Mapping[str, str] = {f"{PROJECT}.io/pool": "gpu"}

# Kubernetes keeps the keys of these domains and their subdomains for itself:
# kubernetes.io/hostname, topology.kubernetes.io/zone, node.kubernetes.io/not-ready, ... Its
# components set them and select on them (every selector on kubernetes.io/hostname breaks if
# the pool's nodes share one value), and its controllers add and remove its taints.
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/
RESERVED_DOMAINS = ("kubernetes.io", "k8s.io")

# The two label prefixes of those domains that Kubernetes documents for administrators to set
# on Nodes: node-role.kubernetes.io/<role> (control-plane is the one role Kubernetes defines:
# kubeadm marks its control-plane nodes with it, and the EndpointSlice controller leaves such
# nodes out of topology hints) and [<prefix>.]node-restriction.kubernetes.io/<name>, the
# prefix reserved for administrators that the NodeRestriction admission plugin keeps kubelets
# from setting (v1.LabelNamespaceNodeRestriction). Everything else in the reserved domains is
# Kubernetes' own: the kubelet's labels (k8s.io/kubelet pkg/apis IsKubeletLabel), the
# well-known topology and instance labels, the node lifecycle controller's taints.
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/#node-role-kubernetes-io
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/admission/noderestriction/admission.go
ROLE_DOMAIN = "node-role.kubernetes.io"
KUBERNETES_ROLE = "control-plane"
NODE_RESTRICTION_DOMAIN = "node-restriction.kubernetes.io"


def _in_domain(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith(f".{parent}")


def in_reserved_domain(key: str) -> bool:
    """Whether a label or taint key's prefix is a domain Kubernetes keeps for itself."""
    domain = key.rpartition("/")[0]
    return any(_in_domain(domain, reserved) for reserved in RESERVED_DOMAINS)


def reserved_label_problem(key: str) -> str | None:
    """Why a pool label may not have this key (one of Kubernetes' own), or None."""
    domain, _, name = key.rpartition("/")
    if not in_reserved_domain(key) or _in_domain(domain, NODE_RESTRICTION_DOMAIN):
        return None
    if domain == ROLE_DOMAIN and name != KUBERNETES_ROLE:
        return None
    if domain == ROLE_DOMAIN:
        return (
            f"{key} marks control-plane nodes, the one node role Kubernetes defines; "
            f"name the pool's role another way, e.g. {ROLE_DOMAIN}/gpu"
        )
    return (
        f"{domain} is a domain Kubernetes keeps for its own labels; use your own domain "
        f"(e.g. {next(iter(DEFAULT_LABELS))}), {ROLE_DOMAIN}/<role> or "
        f"[<prefix>.]{NODE_RESTRICTION_DOMAIN}/<name>"
    )


def _check_label_key(key: Any) -> bool:
    if not isinstance(key, str) or not is_qualified_name(key):
        raise problem(LABEL_KEY.allowed)
    why = reserved_label_problem(key)
    if why:
        raise problem(f"not a label the pool may set: {why}")
    return True


def _check_taint_key(key: Any) -> bool:
    if not isinstance(key, str) or not is_qualified_name(key):
        raise problem(QUALIFIED_NAME.allowed)
    if in_reserved_domain(key):
        raise problem(
            f"not a taint the pool may set: {key.rpartition('/')[0]} is a domain Kubernetes keeps "
            "for its own taints (node.kubernetes.io/not-ready, ...), which its controllers add "
            f"and remove; use your own domain or a GPU resource's name (the default, {WHOLE_GPU})"
        )
    return True


_RESERVED_TEXT = f"outside {' and '.join(RESERVED_DOMAINS)} and their subdomains, Kubernetes' own"
POOL_LABEL_KEY = Rule(
    f"expected a label key (a qualified name) {_RESERVED_TEXT}, except {ROLE_DOMAIN}/<role> "
    f"(not {KUBERNETES_ROLE}) and [<prefix>.]{NODE_RESTRICTION_DOMAIN}/<name>, the prefixes "
    "Kubernetes leaves to administrators",
    _check_label_key,
)
POOL_TAINT_KEY = Rule(
    f"expected a taint key (a qualified name, e.g. {WHOLE_GPU}) {_RESERVED_TEXT}",
    _check_taint_key,
)


class Taint(Settings):
    """A node taint; the default is the one the GPU Operator's daemonsets tolerate."""

    key: Annotated[str, POOL_TAINT_KEY] = WHOLE_GPU
    """Taint key (a qualified name outside Kubernetes' own domains)."""
    value: Annotated[str, text(is_label_value, "expected <= 63 alphanumerics, '-', '_' or '.'")] = (
        "present"
    )
    """Taint value (may be empty)."""
    effect: Annotated[TaintEffect, TAINT_EFFECT] = "NoSchedule"
    """NoSchedule or PreferNoSchedule: the effects GPU pods are given a toleration for."""

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}

    def toleration(self) -> dict[str, str]:
        """The toleration a pod needs to run on a node with this taint."""
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


class TaintedGpuPoolSettings(Settings):
    """The GPU nodes, their taint and labels (the stack config's gpuPool)."""

    nodes: NodeRefs = ()
    """Names of the GPU nodes, each in the inventory (gpu-cluster:nodes)."""
    taint: Taint = Field(default_factory=Taint)
    """Taint put on every GPU node; other taints on the node are left alone."""
    labels: dict[Annotated[str, POOL_LABEL_KEY], Annotated[str, LABEL_VALUE]] = Field(
        default_factory=lambda: dict(DEFAULT_LABELS)
    )
    """Labels put on every GPU node (destroy puts back the values they replaced); none of
    Kubernetes' own (kubernetes.io/hostname, topology.kubernetes.io/zone, ...)."""
