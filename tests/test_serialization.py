"""The SDK's serialize_provider leaks a pickler wrapper per call; the project's wrapper stops it."""

from __future__ import annotations

import pickle
import sys

import pulumi.dynamic
from pulumi.dynamic import dynamic

from components.providers import serialization


class _Provider(pulumi.dynamic.ResourceProvider):
    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings


def _sdk_serialize() -> object:
    """The SDK's own function, unwrapped, whatever install() did."""
    current = dynamic.serialize_provider
    return (
        current.__closure__[0].cell_contents
        if getattr(current, "restores_pickler", False)
        else current
    )


def test_sdk_serialize_provider_leaks_one_pickler_wrapper_per_call() -> None:
    """Reproduces the SDK bug: drop components/providers/serialization.py once this fails."""
    serialize = _sdk_serialize()
    before = pickle._Pickler.__dict__.get("_batch_setitems")
    try:
        serialize(_Provider({"b": "2", "a": "1"}))  # type: ignore[operator]
        after = pickle._Pickler.__dict__.get("_batch_setitems")
        assert after is not before, "the SDK no longer leaks its pickler patch"
    finally:
        pickle._Pickler._batch_setitems = before  # type: ignore[attr-defined]


def test_installed_wrapper_keeps_the_pickler_and_the_output() -> None:
    serialization.install()
    serialization.install()  # idempotent: one wrapper, not two
    assert not getattr(_sdk_serialize(), "restores_pickler", False)
    before = pickle._Pickler.__dict__.get("_batch_setitems")
    provider = _Provider({"b": "2", "a": "1"})
    first = dynamic.serialize_provider(provider)
    assert pickle._Pickler.__dict__.get("_batch_setitems") is before
    # Deterministic (sorted) and equal to what the SDK itself produces for one call.
    assert dynamic.serialize_provider(provider) == first
    try:
        assert _sdk_serialize()(provider) == first  # type: ignore[operator]
    finally:
        pickle._Pickler._batch_setitems = before  # type: ignore[attr-defined]


def test_thousands_of_serializations_stay_within_the_recursion_limit() -> None:
    """Without the wrapper the 1,000th call or so raises RecursionError."""
    serialization.install()
    provider = _Provider({"key": "value"})
    for _ in range(sys.getrecursionlimit() + 500):
        dynamic.serialize_provider(provider)
