"""The Kubernetes names the stack config accepts: DNS-1123 names, qualified names, label values,
hosts, namespaces a layer may create, node names and references to the node inventory.

Each check is Kubernetes' own pattern (apimachinery validation), written once as a `Rule` whose
text is both the error message and the line in docs/config-reference.md.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic_core import core_schema

from components.settings import PROJECT, ContextRule, problem, text, unique

# Kubernetes' own patterns (apimachinery validation), ASCII only, matched whole (fullmatch).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS1123_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)


_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)


# --------------------------------------------------------------------------- name rules


def is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """Kubernetes qualified name: optional `dns-subdomain/` prefix, then a name part <= 63."""
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns1123_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME_PART.fullmatch(name) is not None


# Who creates a DaemonSet's pods: kube-controller-manager, as its daemon-set-controller
# ServiceAccount with --use-service-account-credentials (kubeadm's default), else as itself.
DAEMONSET_CONTROLLERS = (
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:daemon-set-controller",
)


def service_account_user(namespace: str, name: str) -> str:
    """The username the API server authenticates a ServiceAccount's tokens as.
    Ref: https://kubernetes.io/docs/reference/access-authn-authz/authentication/#service-account-tokens
    """
    return f"system:serviceaccount:{namespace}:{name}"


def extended_resource_problem(name: str) -> str | None:
    """Why `name` is not an extended resource name (Kubernetes' IsExtendedResourceName: domain/name
    outside the kubernetes.io domain, not starting with `requests.`, a qualified name once
    `requests.` is put in front, as a ResourceQuota names it), or None when it is.

    # Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/core/helper/helpers.go
    # Ref: https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources
    """
    if name.startswith("requests."):
        return "must not start with 'requests.'"
    domain, sep, _ = name.partition("/")
    if not sep:
        return "must be 'domain/name', e.g. example.com/dongle"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for native resources"
    if not is_qualified_name(f"requests.{name}"):
        return "must be a DNS subdomain, '/', then 1-63 alphanumerics, '-', '_' or '.'"
    return None


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def is_host(value: str) -> bool:
    """An IPv4/IPv6 address or a DNS host name (no port, no scheme, no path)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return is_dns1123_subdomain(value.lower())


# Namespaces every cluster already has; a layer that creates its namespace cannot take one.
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
NAMESPACE = text(
    lambda v: is_dns1123_label(v) and v not in BUILT_IN_NAMESPACES,
    "expected a namespace name (DNS-1123 label) for the layer to create, not one every "
    f"cluster already has ({', '.join(BUILT_IN_NAMESPACES)})",
)
NODE_NAME = text(is_dns1123_subdomain, "expected a Kubernetes node name (DNS-1123 subdomain)")
QUALIFIED_NAME = text(is_qualified_name, "expected a qualified name, e.g. nvidia.com/gpu")
LABEL_KEY = text(is_qualified_name, "label key must be a qualified name")
LABEL_VALUE = text(is_label_value, "label value must be <= 63 alphanumerics, '-', '_' or '.'")


@dataclass(frozen=True)
class NodeRef(ContextRule):
    """A node name that must be in the inventory (gpu-cluster:nodes).

    The inventory comes from the validation context ({"inventory": {name: address}}); a model
    validated without one (an Args built in code) checks the name's form only.
    """

    allowed: str = f"node is not in {PROJECT}:nodes"

    def validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        if not isinstance(value, str):
            raise problem("expected a node name (a string)")
        inventory = (info.context or {}).get("inventory")
        if inventory is None:
            NODE_NAME.validate(value)
        elif value not in inventory:
            raise problem(self.allowed)
        return value


NodeRefs = Annotated[
    tuple[Annotated[str, NodeRef()], ...],
    AfterValidator(unique("each node may be listed once; it is listed twice")),
]
"""A list of inventory node names, each at most once."""
