"""Keeps the Pulumi SDK's dynamic-provider serialization linear in the number of resources.

`pulumi.dynamic.dynamic.serialize_provider` (SDK 3.272) sorts dictionaries while it pickles a
provider by replacing `pickle._Pickler._batch_setitems` with a wrapper around the *current*
method, and never puts the original back. Every dynamic resource adds one wrapper layer:
each serialization then walks through one layer per earlier resource (quadratic time), and
at about a thousand dynamic resources the chain exceeds Python's recursion limit
(`RecursionError` inside `serialize_provider`, which is how a 500-node GPU pool failed).

`install()` wraps the SDK's function so that the pickler's methods are restored after each
call, one call at a time. The SDK's sorting still applies inside each call, so the
serialized providers are byte-for-byte what the SDK produces. tests/test_serialization.py
reproduces the SDK bug on its own: when it starts to fail, upstream fixed it and this module
can go.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

from pulumi.dynamic import dynamic

_PATCHED = ("_batch_setitems", "save_dict")
_lock = threading.Lock()


def _restoring(serialize: Callable[[Any], str]) -> Callable[[Any], str]:
    def serialize_provider(provider: Any) -> str:
        with _lock:
            saved = {name: pickle._Pickler.__dict__.get(name) for name in _PATCHED}
            try:
                return serialize(provider)
            finally:
                for name, method in saved.items():
                    if method is None:
                        if name in pickle._Pickler.__dict__:
                            delattr(pickle._Pickler, name)
                    else:
                        setattr(pickle._Pickler, name, method)

    serialize_provider.restores_pickler = True  # type: ignore[attr-defined]
    return serialize_provider


def install() -> None:
    """Wrap the SDK's serialize_provider once (idempotent)."""
    current = dynamic.serialize_provider
    if not getattr(current, "restores_pickler", False):
        dynamic.serialize_provider = _restoring(current)
