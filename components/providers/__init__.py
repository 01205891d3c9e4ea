"""The pieces every dynamic provider shares: the node API client, the per-node set, the
credentials and the SDK serialization fix. The layers' own providers live in their folders
(components/<layer>/provider.py).

Pulumi state keeps each dynamic provider pickled under the module path it had when it was
written, and unpickles it by that path on the next refresh, update or destroy. Providers
written before the layers had folders are found here under their earlier paths.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from components.providers import serialization

serialization.install()

EARLIER_PATHS = {
    "components.providers.extended_resource_nodes": "components.extended_resource_nodes.provider",
    "components.providers.pool_nodes": "components.tainted_gpu_pool.provider",
    "components.providers.kubeadm_config": "components.control_plane_features.provider",
}
"""{earlier module path: the module now}; kept while a stack may hold state written before."""


class _EarlierPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an earlier path as a module that hands on the names of its module now."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in EARLIER_PATHS:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        now = importlib.import_module(EARLIER_PATHS[module.__name__])
        module.__dict__.update((k, v) for k, v in vars(now).items() if not k.startswith("__"))


sys.meta_path.append(_EarlierPath())
