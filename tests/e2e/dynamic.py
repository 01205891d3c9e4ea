"""Stand-in for the dynamic provider host: the program's own providers, called as the host calls them.

A dynamic resource carries its provider serialized (dill, base64) in the `__provider` input;
the host deserializes it and calls check, then create, diff/update or delete with plain
values (the host does not accept secrets, so the engine sends them unwrapped). A diff that
names replacements is carried out as delete-then-create, as the node providers ask for
(delete_before_replace).
"""

from __future__ import annotations

import base64
from typing import Any

import dill
from pulumi.dynamic import Config, ConfigureRequest, ResourceProvider

from .engine import PROJECT, Resource, reveal

PROVIDER_KEY = "__provider"


class DynamicResources:
    """Every `pulumi-python:dynamic/*` resource, through its own provider.

    Each provider is configured with the stack's config first, as the engine does when it
    starts the provider (that is where the node providers find their credentials).
    """

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        """The stack config of the run (set by whoever runs the engine)."""

    def _provider(self, props: dict[str, Any]) -> ResourceProvider:
        provider: ResourceProvider = dill.loads(base64.b64decode(props[PROVIDER_KEY]))
        provider.configure(ConfigureRequest(Config(raw_config=self.config, project_name=PROJECT)))
        return provider

    def _checked(self, olds: dict[str, Any], res: Resource) -> tuple[ResourceProvider, dict]:
        news = reveal(res.inputs)
        provider = self._provider(news)
        result = provider.check(olds, news)
        if result.failures:
            failures = "; ".join(f"{f.property}: {f.reason}" for f in result.failures)
            raise ValueError(f"check failed: {failures}")
        return provider, {**result.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        provider, props = self._checked({}, res)
        result = provider.create(props)
        return str(result.id), {**(result.outs or {}), PROVIDER_KEY: props[PROVIDER_KEY]}

    def _diff(self, old: Resource, new: Resource) -> tuple[ResourceProvider, dict, Any]:
        provider, props = self._checked(old.outputs, new)
        return provider, props, provider.diff(old.id, old.outputs, props)

    def diff(self, old: Resource, new: Resource) -> list[str]:
        _, _, result = self._diff(old, new)
        if result.changes is False:
            return []
        changed = [f"replace {k}" for k in result.replaces or []]
        return changed or ["changes"]

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        provider, props, result = self._diff(old, new)
        if result.replaces:
            provider.delete(old.id, old.outputs)
            new_id, outputs = self.create(new)
            new.id = new_id
            return outputs
        outs = provider.update(old.id, old.outputs, props).outs or {}
        return {**outs, PROVIDER_KEY: props[PROVIDER_KEY]}

    def delete(self, res: Resource) -> None:
        self._provider(res.outputs).delete(res.id, res.outputs)
