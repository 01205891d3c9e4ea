"""How every layer reaches the cluster: one explicit kubernetes Provider plus the credentials
the dynamic providers need. Nothing in the stack uses the ambient default provider."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.providers.credentials import kubeconfig_content


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Credentials and provider handed to every component."""

    provider: k8s.Provider
    """The explicit kubernetes Provider for every Kubernetes object of the stack."""
    kubeconfig: pulumi.Output[str]
    """Self-contained kubeconfig content, always a Pulumi secret. The dynamic providers read
    theirs from the stack config at run time (components/providers/credentials.py)."""
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
