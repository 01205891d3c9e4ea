"""priorityClasses: what the config accepts, and what it refuses before anything is applied."""

from __future__ import annotations

from typing import Any

import pytest

from components.gpu_priority_classes.settings import DEFAULT_CLASSES, HIGHEST_USER_PRIORITY
from stack_config import ConfigError, parse_stack_config


def _problems(section: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"priorityClasses": section})
    return [str(p) for p in excinfo.value.problems]


def test_priority_classes_are_off_by_default_with_inference_over_training_over_batch() -> None:
    settings = parse_stack_config({}).priority_classes
    assert settings.enabled is False
    assert [(c.name, c.value) for c in settings.classes] == [
        ("gpu-inference", 100_000),
        ("gpu-training", 10_000),
        ("gpu-batch", 1_000),
    ]
    assert settings.classes == DEFAULT_CLASSES
    assert {c.name: c.preemption_policy for c in settings.classes}["gpu-batch"] == "Never"


def test_priority_classes_load_a_configured_set() -> None:
    settings = parse_stack_config(
        {
            "priorityClasses": {
                "enabled": True,
                "classes": [{"name": "llm-serving", "value": 5000, "preemptionPolicy": "Never"}],
            }
        }
    ).priority_classes
    (only,) = settings.classes
    assert (only.name, only.value, only.preemption_policy) == ("llm-serving", 5000, "Never")


@pytest.mark.parametrize(
    ("entry", "key", "allowed"),
    [
        (
            {"name": "system-gpu", "value": 1},
            "priorityClasses.classes[0].name",
            "not starting with 'system-'",
        ),
        (
            {"name": "Bad_Name", "value": 1},
            "priorityClasses.classes[0].name",
            "DNS-1123 subdomain",
        ),
        (
            {"name": "gpu", "value": HIGHEST_USER_PRIORITY + 1},
            "priorityClasses.classes[0].value",
            "higher values are for Kubernetes' system classes",
        ),
        (
            {"name": "gpu", "value": "high"},
            "priorityClasses.classes[0].value",
            "expected an integer",
        ),
        (
            {"name": "gpu", "value": 1, "preemptionPolicy": "Sometimes"},
            "priorityClasses.classes[0].preemptionPolicy",
            "allowed: PreemptLowerPriority, Never",
        ),
        (
            {"name": "gpu", "value": 1, "globalDefault": True},
            "priorityClasses.classes[0].globalDefault",
            "unknown key",
        ),
    ],
)
def test_priority_classes_refuse_what_would_touch_others(
    entry: dict[str, Any], key: str, allowed: str
) -> None:
    (found,) = _problems({"enabled": True, "classes": [entry]})
    assert found.startswith(f"gpu-cluster:{key}: "), found
    assert allowed in found


def test_priority_classes_refuse_a_name_twice() -> None:
    (found,) = _problems({"classes": [{"name": "gpu", "value": 1}, {"name": "gpu", "value": 2}]})
    assert found == (
        "gpu-cluster:priorityClasses.classes[1].name: got 'gpu'; each class name at most once"
    )


def test_priority_classes_allow_no_namespace_by_default_and_name_the_classes_when_on() -> None:
    off = parse_stack_config({}).priority_classes
    assert off.allowed_namespaces == ()
    # What the gate keeps to GPU pods: the classes the stack creates, none while it creates none.
    assert off.created_names() == ()
    on = parse_stack_config(
        {"priorityClasses": {"enabled": True, "allowedNamespaces": ["ml-serving", "web"]}}
    ).priority_classes
    assert on.created_names() == ("gpu-inference", "gpu-training", "gpu-batch")
    assert on.allowed_namespaces == ("ml-serving", "web")


@pytest.mark.parametrize(
    ("namespaces", "found"),
    [
        (
            ["ml-serving", "Web_Team"],
            "gpu-cluster:priorityClasses.allowedNamespaces[1]: got 'Web_Team'; expected the name "
            "of a namespace (DNS-1123 label) whose pods may name the stack's PriorityClasses "
            "without asking for a GPU",
        ),
        (
            ["web", "web"],
            "gpu-cluster:priorityClasses.allowedNamespaces[1]: got 'web'; each namespace at most "
            "once",
        ),
    ],
)
def test_priority_classes_refuse_allowed_namespaces_that_are_no_namespace_names(
    namespaces: list[str], found: str
) -> None:
    assert _problems({"enabled": True, "allowedNamespaces": namespaces}) == [found]
