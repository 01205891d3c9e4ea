"""The shared base of the settings models: Args built from settings, and the error format."""

from __future__ import annotations

from typing import Any, cast

import pytest

from components.binpack_scheduler.component import BinpackSchedulerArgs
from components.binpack_scheduler.settings import BinpackSchedulerSettings
from components.kubernetes_names import is_host, is_qualified_name
from components.opa_gate.settings import OpaGateSettings
from components.tainted_gpu_pool.component import TaintedGpuPoolArgs
from stack_config import ConfigError, parse_stack_config

ACCESS = cast(Any, object())  # runtime inputs pass through unvalidated


def test_settings_from_settings_carries_every_setting_and_the_runtime_inputs() -> None:
    settings = BinpackSchedulerSettings(name="gpu-pack", replicas=3)
    args = BinpackSchedulerArgs.from_settings(settings, access=ACCESS, kubernetes_version="v1.37.2")
    assert args.model_dump(include=set(BinpackSchedulerSettings.model_fields)) == (
        settings.model_dump()
    )
    assert (args.access, args.kubernetes_version) == (ACCESS, "v1.37.2")


def test_settings_from_settings_refuses_another_layers_settings() -> None:
    with pytest.raises(TypeError, match="TaintedGpuPoolArgs takes TaintedGpuPoolSettings"):
        TaintedGpuPoolArgs.from_settings(OpaGateSettings(), access=ACCESS)


def test_settings_unknown_key_in_a_list_item_names_the_keys_allowed_there() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"nodes": [{"name": "cp-1", "adress": "10.0.0.1"}]})
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:nodes[0].adress: unknown key; allowed: name, address, previousNames"
    ]


def test_settings_wrong_container_types_are_named_in_plain_words() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"nodes": {"name": "cp-1"}, "gpuPool": ["cp-1"]})
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:nodes: got {'name': 'cp-1'}; expected a list",
        "gpu-cluster:gpuPool: got ['cp-1']; expected an object",
    ]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("10.0.0.1", True), ("::1", True), ("node-1.lab", True), ("10.0.0.1:22", False), ("", False)],
)
def test_settings_host_rule(value: str, ok: bool) -> None:
    assert is_host(value) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("gpu", True),
        ("/gpu", False),
        ("Example.com/gpu", False),
        ("example.com/" + "a" * 64, False),
        ("example.com/gpu\n", False),
    ],
)
def test_settings_qualified_name_rule(value: str, ok: bool) -> None:
    assert is_qualified_name(value) is ok


def test_settings_null_config_key_takes_its_default_but_a_null_runtime_input_stays() -> None:
    args = BinpackSchedulerArgs.model_validate(
        {"replicas": None, "access": None, "kubernetes_version": "v1.37.2"}
    )
    assert (args.replicas, args.access) == (2, None)


def test_settings_unknown_key_in_an_optional_section_names_that_sections_keys() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"gpuOperator": {"devicePlugin": {"timeSlicing": {"replica": 4}}}})
    assert [str(p) for p in excinfo.value.problems] == [
        # The missing key's problem does not show its parent object, which holds the typo.
        "gpu-cluster:gpuOperator.devicePlugin.timeSlicing.replicas: required",
        "gpu-cluster:gpuOperator.devicePlugin.timeSlicing.replica: unknown key; "
        "allowed: replicas, renameByDefault",
    ]
