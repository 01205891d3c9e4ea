"""Stand-ins for what cannot run here, each recording what it was asked to do.

- RemoteCommands: `command:remote:*` (no SSH hosts on this machine). The create and delete
  command strings are kept, in order, so scenarios can check what would run on each host.
- HelmReleases: `kubernetes:helm.sh/v3:Release` (no chart can be had here). The values handed
  to the chart are kept. A release whose chart brings CRDs the program's own objects need
  (kube-prometheus-stack: monitoring.coreos.com) installs those CRDs, when the harness has
  them (see tests/e2e/crds.py), and leaves them on delete, as `helm uninstall` does.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from .engine import Resource, reveal


def _comparable(value: Any) -> Any:
    """Inputs as the engine compares them: an asset or archive by its content, not identity."""
    if isinstance(value, pulumi.asset.FileAsset | pulumi.asset.FileArchive):
        path = Path(str(value.path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else str(path)
        return (type(value).__name__, digest)
    if isinstance(value, pulumi.asset.StringAsset):
        return ("StringAsset", value.text)
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def changed_inputs(old: Resource, new: Resource) -> list[str]:
    """The top-level inputs whose values differ (secrets compared by value)."""
    keys = set(old.inputs) | set(new.inputs)
    return sorted(
        k
        for k in keys
        if _comparable(reveal(old.inputs.get(k))) != _comparable(reveal(new.inputs.get(k)))
    )


@dataclass
class Command:
    """One remote command as declared: where, what on create, what on delete."""

    name: str
    host: str
    create: str
    delete: str


@dataclass
class RemoteCommands:
    """`command:remote:Command` and `CopyToRemote`, recorded instead of run."""

    created: list[Command] = field(default_factory=list)
    deleted: list[Command] = field(default_factory=list)

    def _command(self, res: Resource) -> Command:
        inputs = reveal(res.inputs)
        connection = inputs.get("connection") or {}
        return Command(
            name=res.name,
            host=str(connection.get("host", "")),
            create=str(inputs.get("create", "")),
            delete=str(inputs.get("delete", "")),
        )

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        self.created.append(self._command(res))
        return uuid.uuid4().hex, {**res.inputs, "stdout": "", "stderr": ""}

    def diff(self, old: Resource, new: Resource) -> list[str]:
        return changed_inputs(old, new)

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        self.created.append(self._command(new))
        return {**new.inputs, "stdout": "", "stderr": ""}

    def delete(self, res: Resource) -> None:
        self.deleted.append(self._command(res))


@dataclass
class Release:
    """One Helm release as declared."""

    name: str
    namespace: str
    chart: str
    version: str
    repository: str
    values: dict[str, Any]


# chart name -> installs the CRDs that chart ships (given a function that applies CRDs).
ChartCrds = Mapping[str, Callable[[], None]]


@dataclass
class HelmReleases:
    """`kubernetes:helm.sh/v3:Release`, recorded; the chart's CRDs installed when known."""

    chart_crds: ChartCrds = field(default_factory=dict)
    releases: dict[str, Release] = field(default_factory=dict)

    def _release(self, res: Resource) -> Release:
        inputs = reveal(res.inputs)
        repository = (inputs.get("repositoryOpts") or {}).get("repo", "")
        return Release(
            name=str(inputs.get("name") or res.name),
            namespace=str(inputs.get("namespace") or "default"),
            chart=str(inputs.get("chart", "")),
            version=str(inputs.get("version", "")),
            repository=str(repository),
            values=dict(inputs.get("values") or {}),
        )

    def _outputs(self, res: Resource, release: Release) -> dict[str, Any]:
        status = {
            "name": release.name,
            "namespace": release.namespace,
            "chart": release.chart,
            "version": release.version,
            "status": "deployed",
            "revision": 1,
        }
        return {**res.inputs, "status": status}

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        release = self._release(res)
        # The chart as a repository name, an OCI reference or a local copy's path.
        name = Path(release.chart).name
        install = next((f for chart, f in self.chart_crds.items() if name.startswith(chart)), None)
        if install is not None:
            install()
        self.releases[res.key] = release
        return f"{release.namespace}/{release.name}", self._outputs(res, release)

    def diff(self, old: Resource, new: Resource) -> list[str]:
        return changed_inputs(old, new)

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        release = self._release(new)
        self.releases[new.key] = release
        return self._outputs(new, release)

    def delete(self, res: Resource) -> None:
        # `helm uninstall` keeps the CRDs of the chart's crds/ directory.
        self.releases.pop(res.key, None)
