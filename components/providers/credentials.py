"""How the dynamic providers reach the cluster: from the current run's stack config.

The engine hands every dynamic provider the stack's configuration when it starts it
(`ResourceProvider.configure`), for `up`, `refresh` and `destroy` alike. The node providers
read `gpu-cluster:kubeconfig` and `gpu-cluster:kubeContext` from it, so credentials are never
resource inputs: they are not copied into the state (nor into every resource's diff), a run
from another machine or after a certificate rotation uses its own, and destroy never uses a
stale copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.providers.node_api import flatten_kubeconfig

PROJECT = "gpu-cluster"
KUBECONFIG_KEY = f"{PROJECT}:kubeconfig"
CONTEXT_KEY = f"{PROJECT}:kubeContext"


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


@dataclass(frozen=True)
class Credentials:
    kubeconfig: str
    """Self-contained kubeconfig content ("" uses the client's default lookup)."""
    context: str | None


def from_stack_config(config: Any) -> Credentials:
    """Credentials from a `pulumi.dynamic.Config` (or anything with `get(key)`)."""
    return Credentials(
        kubeconfig_content(str(config.get(KUBECONFIG_KEY) or "")),
        str(config.get(CONTEXT_KEY) or "") or None,
    )
