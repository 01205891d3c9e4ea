"""admission.poolNamespaces and admission.poolDaemonSets: where pods that ask for no GPU may run
on the GPU pool's nodes. Read, and refused at load with the key, the value and what is allowed;
every problem at once."""

from __future__ import annotations

from typing import Any

import pytest

from components.opa_gate.settings import OpaGateSettings
from stack_config import ConfigError, StackConfig, decode_raw_config, parse_stack_config
from tests.conftest import stack_config


def _parse(**admission: Any) -> StackConfig:
    raw = decode_raw_config(stack_config("dev"))
    return parse_stack_config({**raw, "admission": {**raw.get("admission", {}), **admission}})


def _problems(**admission: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        _parse(**admission)
    return [str(p) for p in excinfo.value.problems]


def test_pool_fence_settings_default_to_none() -> None:
    settings = OpaGateSettings()
    assert (settings.pool_namespaces, settings.pool_daemon_sets) == ((), ())


def test_pool_fence_settings_are_read() -> None:
    config = _parse(poolNamespaces=["calico-system"], poolDaemonSets=["logging/fluent-bit"])
    assert config.admission.pool_namespaces == ("calico-system",)
    assert config.admission.pool_daemon_sets == ("logging/fluent-bit",)


def test_pool_fence_settings_refuse_what_names_no_namespace_or_daemonset() -> None:
    assert _problems(
        poolNamespaces=["Calico_System"], poolDaemonSets=["fluent-bit", "logging/Fluent_Bit"]
    ) == [
        "gpu-cluster:admission.poolNamespaces[0]: got 'Calico_System'; expected the name of a "
        "namespace (DNS-1123 label) whose pods may run on the GPU pool's nodes without asking "
        "for a GPU",
        "gpu-cluster:admission.poolDaemonSets[0]: got 'fluent-bit'; expected namespace/name of "
        "a DaemonSet (a DNS-1123 label, a DNS-1123 subdomain) whose pods may run on the GPU "
        "pool's nodes without asking for a GPU",
        "gpu-cluster:admission.poolDaemonSets[1]: got 'logging/Fluent_Bit'; expected "
        "namespace/name of a DaemonSet (a DNS-1123 label, a DNS-1123 subdomain) whose pods may "
        "run on the GPU pool's nodes without asking for a GPU",
    ]


def test_pool_fence_settings_refuse_an_entry_twice() -> None:
    assert _problems(poolNamespaces=["logging", "logging"]) == [
        "gpu-cluster:admission.poolNamespaces[1]: got 'logging'; each namespace at most once"
    ]
