"""Pulumi.yaml's config block and docs/config-reference.md are views of the settings models."""

from __future__ import annotations

import pytest
import yaml

from stack_config import StackConfig, parse_stack_config
from tools.config_docs import (
    MARKER,
    PROJECT_FILE,
    REFERENCE_FILE,
    project_file_text,
    reference_text,
)


def test_config_docs_pulumi_yaml_block_is_the_generated_one() -> None:
    current = PROJECT_FILE.read_text()
    assert current == project_file_text(current), "run: python -m tools.config_docs"


def test_config_docs_reference_is_the_generated_one() -> None:
    assert REFERENCE_FILE.read_text() == reference_text(), "run: python -m tools.config_docs"


def test_config_docs_pulumi_yaml_declares_every_key_with_the_model_default() -> None:
    declared = yaml.safe_load(PROJECT_FILE.read_text())["config"]
    defaults = parse_stack_config({})
    assert list(declared) == [i.alias for i in StackConfig.model_fields.values()]
    assert declared["kubernetesVersion"]["default"] == defaults.kubernetes_version
    assert declared["kubeconfig"]["default"] == defaults.kubeconfig
    # Pulumi passes these declared defaults to the program; they must load as they are.
    values = {key: spec["default"] for key, spec in declared.items()}
    assert parse_stack_config(values) == defaults


def test_config_docs_reference_lists_nested_keys_with_rule_and_default() -> None:
    text = reference_text()
    assert "| `scheduler.replicas` | an integer from 1 to 5 | `2` | Deployment replicas;" in text
    assert "| `gpuPool.taint.effect` | allowed: NoSchedule, PreferNoSchedule (not NoExecute" in text


def test_config_docs_keeps_the_hand_written_head_of_pulumi_yaml() -> None:
    text = project_file_text(f"name: x\n# by hand\n{MARKER}\nconfig:\n  stale: {{}}\n")
    assert text.startswith(f"name: x\n# by hand\n{MARKER}\nconfig:\n  kubeconfig:\n")
    assert "stale" not in text


def test_config_docs_refuses_a_project_file_without_the_marker() -> None:
    with pytest.raises(SystemExit, match="is missing"):
        project_file_text("name: x\nconfig: {}\n")
