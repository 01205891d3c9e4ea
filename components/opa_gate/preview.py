"""The gate's question to the live cluster at preview: does the API server give GPU pods the
pool's toleration itself (ExtendedResourceToleration)? A refusing engine relies on it when the
stack does not enable the plugin (stack_config.server_toleration_of() names the resource to ask
about). A dry-run pod asks (components/cluster_access.py, pod_dry_run) and
server_toleration_problem() (settings.py) judges the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components import cluster_access
from components.opa_gate.settings import (
    EXTENDED_RESOURCE_TOLERATION,
    added_toleration,
    server_toleration_problem,
)
from components.settings import PROJECT, ConfigError

# The namespace of the toleration probe's pod: one every cluster has, that the gate (every
# engine, the routing one included) never judges, so a gate already installed, this stack's
# from an earlier config, neither refuses the probe nor adds the pool's toleration to it.
# Cluster-wide webhooks commonly leave it alone too, and Pod Security admits the probe there
# as it is (it also meets the restricted profile).
PROBE_NAMESPACE = "kube-system"
# Never pulled: a dry-run stores and schedules nothing.
PROBE_IMAGE = "registry.k8s.io/pause:3.10"


def toleration_probe(resource: str) -> dict[str, Any]:
    """A pod asking for one `resource` and no toleration: what ExtendedResourceToleration, when
    the API server runs it, gives the toleration of `resource` at admission."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{PROJECT}-toleration-probe-",
            "labels": {"app.kubernetes.io/part-of": PROJECT},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": PROBE_IMAGE,
                    # An extended resource is asked for with its limit (requests equal it).
                    "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def check_pool_toleration(
    kubeconfig: str,
    context: str | None,
    *,
    engine: str,
    kubernetes_version: str,
    taint: Mapping[str, str],
    resource: str,
) -> str | None:
    """Ask the live API server whether it gives GPU pods the pool's toleration itself
    (ExtendedResourceToleration), which the refusing `engine` relies on when the stack does
    not enable the plugin (stack_config.server_toleration_of names `resource`): a dry-run
    create of a pod asking for `resource` in PROBE_NAMESPACE.

    None when the pod comes back with the plugin's toleration of `resource`; ConfigError
    (naming admission.engine) when it comes back without it; a warning instead of checking
    when the cluster cannot be reached or refuses the probe (RBAC, another admission
    check): a refused dry-run returns no pod to read, so it tells nothing either way.
    """
    try:
        pod = cluster_access.pod_dry_run(kubeconfig, context)(
            PROBE_NAMESPACE, toleration_probe(resource)
        )
    except Exception as exc:  # any failure to reach, or a refusal: skip, say so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        toleration = " ".join(added_toleration(resource).values())
        return (
            f"{PROJECT}:admission.engine {engine} was not checked against the cluster: a "
            f"dry-run create of a pod asking for {resource} (POST /api/v1/namespaces/"
            f"{PROBE_NAMESPACE}/pods?dryRun=All, which needs pod create there) failed: "
            f"{reason}. This engine adds no toleration: unless the API servers run "
            f"{EXTENDED_RESOURCE_TOLERATION} (--enable-admission-plugins), GPU pods asking for "
            f"{resource} never tolerate the pool's taint {taint['key']}="
            f"{taint.get('value', '')}:{taint['effect']} and stay Pending. Check that `kubectl "
            f"create --dry-run=server -o yaml` of such a pod comes back with the toleration "
            f"{toleration}"
        )
    spec = pod.get("spec") or {}
    problem = server_toleration_problem(
        engine=engine,
        kubernetes_version=kubernetes_version,
        taint=taint,
        resource=resource,
        tolerations=[t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)],
    )
    if problem is not None:
        raise ConfigError([problem])
    return None
