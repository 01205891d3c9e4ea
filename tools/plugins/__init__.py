"""Provider plugins standing in for pulumi-resource-tls and pulumi-resource-command.

Their Go modules cannot be fetched here (tools/README.md), so `tls.py` and `command.py` speak
the provider gRPC protocol through the Python SDK's provider server instead. The engine starts
them like the real plugins, by executable name on PATH: `tools/plugins/bin` holds the two
launchers. Each module's docstring lists what of the real provider it leaves out.

This module holds what both share: values in and out of the engine's property values, the
input diff, and serving a provider to the engine.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Collection, Mapping
from typing import Any

from pulumi.provider.experimental import server
from pulumi.provider.experimental.property_value import PropertyValue
from pulumi.provider.experimental.provider import (
    DiffResponse,
    PropertyDiff,
    PropertyDiffKind,
    Provider,
)
from pulumi.runtime import rpc

UNKNOWN = object()
"""`plain` of a value the engine does not know yet (a preview): equal to nothing else.

On the wire an unknown is the string rpc.UNKNOWN; the SDK's PropertyValue passes it through as
a plain string (its Computed value cannot be marshalled).
"""

_REPLACE = {
    PropertyDiffKind.ADD: PropertyDiffKind.ADD_REPLACE,
    PropertyDiffKind.DELETE: PropertyDiffKind.DELETE_REPLACE,
    PropertyDiffKind.UPDATE: PropertyDiffKind.UPDATE_REPLACE,
}


def plain(value: PropertyValue | None) -> Any:
    """The Python value of a property: secrets revealed, numbers as floats, unknowns UNKNOWN."""
    if value is None:
        return None
    inner = value.value
    if inner == rpc.UNKNOWN:
        return UNKNOWN
    if isinstance(inner, Mapping):
        return {k: plain(v) for k, v in inner.items()}
    if isinstance(inner, tuple):
        return [plain(v) for v in inner]
    return inner


def wrap(value: Any, *, secret: bool = False) -> PropertyValue:
    """A property value of a plain str/bool/number/list/dict value."""
    if isinstance(value, PropertyValue):
        return value.with_secret(True) if secret else value
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif isinstance(value, list | tuple):
        value = [wrap(v) for v in value]
    elif isinstance(value, dict):
        value = {k: wrap(v) for k, v in value.items()}
    return PropertyValue(value, is_secret=secret)


def unknown(*, secret: bool = False) -> PropertyValue:
    """An output the engine learns only when the operation runs (the value of a preview)."""
    return PropertyValue(rpc.UNKNOWN, is_secret=secret)


def changed_inputs(
    olds: Mapping[str, PropertyValue],
    news: Mapping[str, PropertyValue],
    outputs: Collection[str],
) -> dict[str, PropertyDiffKind]:
    """Inputs whose value differs between the old state and the new inputs.

    The old state holds the inputs and the outputs the provider added (`outputs`). Secretness
    alone is no change; an unknown new value (a preview) is one.
    """
    changes = {}
    for key in sorted((olds.keys() | news.keys()) - set(outputs)):
        old, new = plain(olds.get(key)), plain(news.get(key))
        if old == new:
            continue
        if old is None:
            changes[key] = PropertyDiffKind.ADD
        elif new is None:
            changes[key] = PropertyDiffKind.DELETE
        else:
            changes[key] = PropertyDiffKind.UPDATE
    return changes


def diff_response(
    changes: Mapping[str, PropertyDiffKind], replaces: Collection[str]
) -> DiffResponse:
    """The engine's diff of `changes`; the keys in `replaces` need a new resource."""
    detailed = {
        key: PropertyDiff(_REPLACE[kind] if key in replaces else kind, input_diff=True)
        for key, kind in changes.items()
    }
    return DiffResponse(
        changes=bool(changes),
        replaces=[key for key in changes if key in replaces],
        diffs=list(changes),
        detailed_diff=detailed,
    )


def serve(provider: Provider, package: str) -> None:
    """Serve `provider` to the engine (its port on stdout).

    The plugin reports the version of the installed SDK `package`: the version the SDK asks the
    engine for, whatever requirements.txt pins.
    """
    server.main(sys.argv[1:], importlib.metadata.version(package), provider)
