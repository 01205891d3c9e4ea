"""Which stand-in plays which provider plugin (see engine.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from .dynamic import DynamicResources
from .engine import Provider, Resource
from .kubernetes import PROVIDER_TYPE, KubernetesObjects
from .recorded import ChartCrds, HelmReleases, RemoteCommands
from .tls import TlsProvider

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


class ProviderResources:
    """A provider instance other than the kubernetes one (command, tls): nothing to create."""

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        return uuid.uuid4().hex, dict(res.inputs)

    def diff(self, old: Resource, new: Resource) -> list[str]:
        return []

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        return dict(new.inputs)

    def delete(self, res: Resource) -> None:
        return None


@dataclass
class StandIns:
    """One stand-in per provider plugin, kept so scenarios can read what each recorded."""

    chart_crds: ChartCrds = field(default_factory=dict)
    kubernetes: KubernetesObjects = field(default_factory=KubernetesObjects)
    dynamic: DynamicResources = field(default_factory=DynamicResources)
    tls: TlsProvider = field(default_factory=TlsProvider)
    commands: RemoteCommands = field(default_factory=RemoteCommands)
    helm: HelmReleases = field(init=False)
    other_providers: ProviderResources = field(default_factory=ProviderResources)

    def __post_init__(self) -> None:
        self.helm = HelmReleases(chart_crds=self.chart_crds)

    def __call__(self, typ: str) -> Provider:
        if typ == HELM_RELEASE:
            return self.helm
        if typ == PROVIDER_TYPE or typ.startswith("kubernetes:"):
            return self.kubernetes
        if typ.startswith("pulumi-python:dynamic"):
            return self.dynamic
        if typ.startswith("tls:"):
            return self.tls
        if typ.startswith("command:remote:"):
            return self.commands
        if typ.startswith("pulumi:providers:"):
            return self.other_providers
        raise ValueError(f"no stand-in for resource type {typ}")
