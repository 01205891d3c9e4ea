"""How every layer reaches the cluster: one explicit kubernetes Provider plus the credentials
the dynamic providers need. Nothing in the stack uses the ambient default provider."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from components.providers.node_api import flatten_kubeconfig


def kubeconfig_content(value: str) -> str:
    """Kubeconfig text from a path or inline content; "" means $KUBECONFIG or ~/.kube/config.

    Returns "" when no kubeconfig exists, so a preview on a machine without a cluster still
    runs; operations then fail with the dynamic providers' own error.
    """
    if "\n" in value:
        return value
    if value:
        candidates = [Path(value).expanduser()]
    else:
        env = os.environ.get("KUBECONFIG", "")
        candidates = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
        candidates.append(Path("~/.kube/config").expanduser())
    for path in candidates:
        if path.is_file():
            return flatten_kubeconfig(path)
    return ""


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Credentials and provider handed to every component."""

    provider: k8s.Provider
    """The explicit kubernetes Provider for every Kubernetes object of the stack."""
    kubeconfig: pulumi.Output[str]
    """Self-contained kubeconfig content, always a Pulumi secret (for dynamic providers)."""
    context: str | None
    """Kubeconfig context, or None for its current-context."""

    @classmethod
    def create(cls, name: str, kubeconfig: str, context: str | None) -> ClusterAccess:
        content = kubeconfig_content(kubeconfig)
        secret = pulumi.Output.secret(content)
        provider = k8s.Provider(
            name,
            kubeconfig=secret if content else None,
            context=context,
            enable_server_side_apply=True,
        )
        return cls(provider=provider, kubeconfig=secret, context=context)
