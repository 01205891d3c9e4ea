"""Kubeconfig files for a local control plane, with the credentials embedded."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_yaml(
    server: str,
    ca_path: Path,
    cert_path: Path,
    key_path: Path,
    user: Mapping[str, str] | None = None,
) -> str:
    """A kubeconfig for ``server`` as the client certificate's user.

    ``user`` replaces the certificate credentials, e.g. ``{"token": "..."}``.
    """
    credentials = (
        dict(user)
        if user is not None
        else {"client-certificate-data": _b64(cert_path), "client-key-data": _b64(key_path)}
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_path)},
            }
        ],
        "users": [{"name": "admin", "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_kubeconfig(path: Path, text: str) -> Path:
    """Write a kubeconfig readable by its owner only."""
    path.write_text(text)
    path.chmod(0o600)
    return path
