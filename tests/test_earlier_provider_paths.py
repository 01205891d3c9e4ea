"""Dynamic providers pickled into Pulumi state under the module paths they had before the layers
were folders still load: the provider host unpickles the state's `__provider` by module path on
every refresh, update and destroy (components/providers/__init__.py, EARLIER_PATHS)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from pulumi.dynamic import dynamic

from components.control_plane_features.provider import KubeadmConfigProvider
from components.extended_resource_nodes.provider import ExtendedResourceNodesProvider
from components.providers import EARLIER_PATHS
from components.tainted_gpu_pool.provider import GpuPoolNodesProvider

ROOT = Path(__file__).resolve().parent.parent

PROVIDERS = {
    "components.providers.extended_resource_nodes": ExtendedResourceNodesProvider,
    "components.providers.pool_nodes": GpuPoolNodesProvider,
    "components.providers.kubeadm_config": KubeadmConfigProvider,
}

# What the provider host does with the state's `__provider` (pulumi/dynamic/__main__.py), in a
# fresh interpreter that has imported nothing of the project; then whether the class it got is
# the one of the module now.
_LOAD = """
import base64, importlib, sys
import dill
provider = dill.loads(base64.b64decode(sys.stdin.read()))
cls = type(provider)
print(cls.__module__, cls.__name__, cls is getattr(importlib.import_module(sys.argv[1]), cls.__name__))
"""


def test_earlier_paths_are_every_provider_that_moved() -> None:
    assert {old: cls.__module__ for old, cls in PROVIDERS.items()} == EARLIER_PATHS


@pytest.mark.parametrize("earlier", sorted(PROVIDERS))
def test_a_provider_pickled_under_its_earlier_path_loads_as_the_provider_now(earlier: str) -> None:
    cls = PROVIDERS[earlier]
    now = cls.__module__
    cls.__module__ = earlier  # as the SDK pickled it when the class lived there
    try:
        blob = dynamic.serialize_provider(cls())
    finally:
        cls.__module__ = now
    assert earlier.encode() in base64.b64decode(blob)
    loaded = subprocess.run(
        [sys.executable, "-c", _LOAD, now],
        input=blob,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert loaded.stdout.split() == [now, cls.__name__, "True"]
