"""How the dynamic providers reach the cluster: from the current run's stack config.

The engine hands every dynamic provider the stack's configuration when it starts it
(`ResourceProvider.configure`), for `up`, `refresh` and `destroy` alike. Every dynamic provider
of the stack reads `gpu-cluster:kubeconfig` and `gpu-cluster:kubeContext` from it, so credentials are never
resource inputs: they are not copied into the state (nor into every resource's diff), a run
from another machine or after a certificate rotation uses its own, and destroy never uses a
stale copy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pulumi.dynamic import ConfigureRequest, ResourceProvider

from components.providers.node_api import NodeApiError, flatten_kubeconfig

PROJECT = "gpu-cluster"
KUBECONFIG_KEY = f"{PROJECT}:kubeconfig"
CONTEXT_KEY = f"{PROJECT}:kubeContext"


class KubeconfigNotFound(ValueError):
    """A configured kubeconfig path that does not exist on this machine."""


def kubeconfig_content(value: str) -> str:
    """Self-contained kubeconfig text for the configured value, loaded as kubectl loads it.

    - content (several lines): used as it is;
    - a path: that file, flattened; a missing file raises KubeconfigNotFound, never a fallback
      to another kubeconfig (it could name another cluster);
    - empty: the files listed in $KUBECONFIG, merged the way kubectl merges them (see
      `merge_kubeconfigs`), or ~/.kube/config when $KUBECONFIG is unset or empty.

    Returns "" when the empty value finds no kubeconfig at all, so a preview on a machine
    without a cluster still runs; operations then fail with the providers' own error.
    """
    if "\n" in value:
        return value
    if value:
        path = Path(value).expanduser()
        if not path.is_file():
            # The path is not shown: it may be stored as a secret.
            raise KubeconfigNotFound(
                f"{KUBECONFIG_KEY}: the configured kubeconfig file does not exist on this "
                "machine; set the path of an existing file (a configured path never falls back "
                "to $KUBECONFIG or ~/.kube/config)"
            )
        return flatten_kubeconfig(path)
    env = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths = env or [Path("~/.kube/config").expanduser()]
    documents = [yaml.safe_load(flatten_kubeconfig(p)) or {} for p in paths if p.is_file()]
    if not documents:
        return ""
    if len(documents) == 1:
        return yaml.safe_dump(documents[0], sort_keys=False)
    return yaml.safe_dump(merge_kubeconfigs(documents), sort_keys=False)


NAMED_SECTIONS = ("clusters", "users", "contexts")


def merge_kubeconfigs(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """kubectl's merge of a $KUBECONFIG list: the first file to set a value wins.

    A cluster, user or context is taken from the first file that names it (later entries of
    the same name are ignored, not merged field by field), and current-context from the first
    file that sets one. Each file is flattened before, so its relative paths stay its own.
    """
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for section in NAMED_SECTIONS:
        entries: dict[str, Any] = {}
        for document in documents:
            for entry in document.get(section) or []:
                entries.setdefault(entry.get("name"), entry)
        merged[section] = list(entries.values())
    current = next((d["current-context"] for d in documents if d.get("current-context")), "")
    if current:
        merged["current-context"] = current
    return merged


@dataclass(frozen=True)
class Credentials:
    kubeconfig: str
    """Self-contained kubeconfig content ("" uses the client's default lookup)."""
    context: str | None


def from_stack_config(config: Any) -> Credentials:
    """Credentials from a `pulumi.dynamic.Config` (or anything with `get(key)`).

    Raises KubeconfigNotFound for a configured path missing on this machine: the engine
    then stops before the provider acts, with that message.
    """
    return Credentials(
        kubeconfig_content(str(config.get(KUBECONFIG_KEY) or "")),
        str(config.get(CONTEXT_KEY) or "") or None,
    )


class RunCredentials(ResourceProvider):
    """A dynamic provider that reaches the cluster with the current run's credentials."""

    def __init__(self) -> None:
        super().__init__()
        self._credentials: Credentials | None = None

    def configure(self, req: ConfigureRequest) -> None:
        """Called by the engine with the stack's config before the provider's first call."""
        self._credentials = from_stack_config(req.config)

    def credentials(self) -> tuple[str, str | None]:
        """(kubeconfig content, context) of this run."""
        if self._credentials is None:
            # Never fall back to ambient or stored credentials: either could be another cluster.
            raise NodeApiError("no cluster credentials: the engine did not configure the provider")
        return self._credentials.kubeconfig, self._credentials.context
