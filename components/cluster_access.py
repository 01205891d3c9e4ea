"""How every layer reaches the cluster: one explicit kubernetes Provider plus the credentials
the dynamic providers need. Nothing in the stack uses the ambient default provider.

Also the one look at the live cluster before anything is declared: the configured
kubernetesVersion (the binpack scheduler's image tag) against the API server's /version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.providers.credentials import kubeconfig_content
from components.providers.node_api import api_client_from_kubeconfig
from components.settings import PROJECT, ConfigError, Problem

# kube-scheduler must not be newer than the kube-apiserver it talks to, and may be at most one
# minor version older (for live upgrades).
# Ref: https://kubernetes.io/releases/version-skew-policy/#kube-controller-manager-kube-scheduler-and-cloud-controller-manager
SCHEDULER_MINORS_BEHIND = 1
# How long a preview waits for /version before going on without the check.
VERSION_TIMEOUT_S = 5.0
_MINOR = re.compile(r"v?(?P<major>[0-9]+)\.(?P<minor>[0-9]+)")


def server_version(kubeconfig: str, context: str | None) -> str:
    """The API server's gitVersion (GET /version). Raises when it cannot be reached."""
    from kubernetes import client

    api = client.VersionApi(api_client_from_kubeconfig(kubeconfig_content(kubeconfig), context))
    info = api.get_code(_request_timeout=VERSION_TIMEOUT_S)
    return str(info.git_version)


def _minors(version: str) -> tuple[int, int] | None:
    match = _MINOR.match(version)
    return None if match is None else (int(match["major"]), int(match["minor"]))


def _allowed(server: tuple[int, int]) -> str:
    major, minor = server
    return " or ".join(f"v{major}.{m}.x" for m in range(minor - SCHEDULER_MINORS_BEHIND, minor + 1))


def scheduler_skew_problem(scheduler: str, server: str) -> Problem | None:
    """Why kube-scheduler `scheduler` must not run against kube-apiserver `server` (it is
    newer), or None."""
    have, want = _minors(server), _minors(scheduler)
    if have is None or want is None or want <= have:
        return None
    return Problem(
        key="kubernetesVersion",
        value=scheduler,
        allowed=f"the cluster's API server is {server}, and the binpack kube-scheduler (this "
        "version) may not be newer than the kube-apiserver (Kubernetes version skew policy); "
        f"allowed: {_allowed(have)}",
    )


def scheduler_skew_warning(scheduler: str, server: str) -> str | None:
    """A warning when kube-scheduler `scheduler` is more than one minor older than `server`:
    outside the skew policy, yet still served by the API server, so not refused (an API
    server upgraded before the stack's kubernetesVersion is the usual cause)."""
    have, want = _minors(server), _minors(scheduler)
    if have is None or want is None or want >= (have[0], have[1] - SCHEDULER_MINORS_BEHIND):
        return None
    return (
        f"{PROJECT}:kubernetesVersion {scheduler} is more than {SCHEDULER_MINORS_BEHIND} minor "
        f"version older than the cluster's API server ({server}), outside the Kubernetes "
        f"version skew policy; set it to {_allowed(have)}"
    )


def check_version_skew(kubeconfig: str, context: str | None, scheduler: str) -> str | None:
    """Refuse (ConfigError) a kubernetesVersion newer than the live cluster's API server.

    Returns a warning for one more than a minor older, or instead of checking when the
    cluster cannot be reached (a preview on a machine without access); None when the
    versions fit.
    """
    try:
        server = server_version(kubeconfig, context)
    except Exception as exc:  # any failure to reach or read /version: skip, say so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"{PROJECT}:kubernetesVersion {scheduler} was not compared with the cluster's "
            f"version: GET /version failed: {reason}"
        )
    problem = scheduler_skew_problem(scheduler, server)
    if problem is not None:
        raise ConfigError([problem])
    return scheduler_skew_warning(scheduler, server)


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
