"""The pull-request preview gives the pull request's code nothing it could misuse.

A preview runs the proposed code with the stack's credentials, and the workflow file itself
comes from the pull request. What keeps that safe is outside the file (a protected GitHub
environment per stack) plus what the credentials can reach: these tests keep the workflow on
environment secrets only and every previewed stack free of an SSH key, so even a preview that
decrypts its stack's secrets cannot reach the hosts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PREVIEW = ROOT / ".github" / "workflows" / "preview.yml"


def _workflow() -> dict[Any, Any]:
    # YAML 1.1 reads the key `on` as True.
    return dict(yaml.safe_load(PREVIEW.read_text()))


def _job() -> dict[str, Any]:
    return dict(_workflow()["jobs"]["preview"])


def test_preview_runs_in_a_per_stack_environment_that_can_be_protected() -> None:
    job = _job()
    assert job["environment"] == "preview-${{ matrix.stack }}"
    # pull_request (the base repository's secrets only after the environment allows it),
    # never pull_request_target, which runs with the base's secrets on any fork's change.
    assert set(_workflow()[True]) == {"pull_request"}
    assert job["if"] == "github.event.pull_request.head.repo.full_name == github.repository"


def test_preview_uses_only_its_environment_s_preview_grade_secrets() -> None:
    used = set(re.findall(r"secrets\.([A-Z_]+)", PREVIEW.read_text().split("\nname:", 1)[1]))
    assert used == {"KUBECONFIG", "PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "GITHUB_TOKEN"}
    assert "SSH" not in PREVIEW.read_text().split("\nname:", 1)[1]


def test_no_previewed_stack_holds_an_ssh_key() -> None:
    for stack in _job()["strategy"]["matrix"]["stack"]:
        config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
        assert "gpu-cluster:sshPrivateKey" not in config, stack
        control_plane = config.get("gpu-cluster:controlPlane") or {}
        if control_plane.get("enabled"):
            assert control_plane.get("sshAgent") is True, stack


def test_checkout_does_not_leave_the_github_token_in_the_working_copy() -> None:
    (checkout,) = [
        s for s in _job()["steps"] if str(s.get("uses", "")).startswith("actions/checkout")
    ]
    assert checkout["with"]["persist-credentials"] is False
