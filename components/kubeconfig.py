"""How a run reaches the cluster: the configured kubeconfig read once into self-contained
content, loaded as kubectl loads it.

The program reads it through stack_config.py; every dynamic provider from the config the engine
hands its `configure` (kubernetes_access), so credentials are never resource inputs.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.settings import PROJECT

# How a run reaches the cluster: the program reads these from its config, each dynamic
# provider from the config the engine hands it (kubernetes_access).
KUBECONFIG_KEY = f"{PROJECT}:kubeconfig"
CONTEXT_KEY = f"{PROJECT}:kubeContext"


def kubeconfig_document(value: str) -> Any:
    """The parsed kubeconfig of a path or content; None when it is not YAML or not readable."""
    try:
        text_value = value if "\n" in value else Path(value).expanduser().read_text()
        return yaml.safe_load(text_value)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


class KubeconfigNotFound(ValueError):
    """A configured kubeconfig path that does not exist on this machine."""


def flatten_kubeconfig(path: Path) -> str:
    """Kubeconfig content with file references inlined, like `kubectl config view --flatten`.

    The content is handed on as it is (to the kubernetes provider as a secret), so it must not
    point at files relative to a laptop's working directory.
    """
    document = yaml.safe_load(path.read_text()) or {}
    base = path.parent
    refs = {
        "clusters": ("cluster", {"certificate-authority": "certificate-authority-data"}),
        "users": (
            "user",
            {"client-certificate": "client-certificate-data", "client-key": "client-key-data"},
        ),
    }
    for section, (inner, keys) in refs.items():
        for entry in document.get(section) or []:
            body = entry.get(inner) or {}
            for file_key, data_key in keys.items():
                ref = body.pop(file_key, None)
                if ref and data_key not in body:
                    body[data_key] = base64.b64encode((base / ref).read_bytes()).decode()
    return yaml.safe_dump(document, sort_keys=False)


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


@dataclass(frozen=True, kw_only=True)
class KubernetesAccessConfig:
    """How every layer reaches the cluster."""

    kubeconfig: str = ""
    """Self-contained kubeconfig content, read once from the configured path or content
    (kubeconfig_content); empty when none was found."""
    context: str | None = None
    """The kubeconfig context; None means its current-context."""


def kubernetes_access(config: Any) -> KubernetesAccessConfig:
    """A dynamic provider's cluster access, from the config the engine hands its `configure`
    (a `pulumi.dynamic.Config`, or anything with `get(full key)`).

    Raises KubeconfigNotFound for a configured path missing on this machine.
    """
    return KubernetesAccessConfig(
        kubeconfig=kubeconfig_content(str(config.get(KUBECONFIG_KEY) or "")),
        context=str(config.get(CONTEXT_KEY) or "") or None,
    )
