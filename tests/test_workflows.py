"""The pull-request preview gives the pull request's code nothing it could misuse.

A preview runs the proposed code with the stack's credentials, and the workflow file itself
comes from the pull request. What keeps that safe is outside the file (a protected GitHub
environment per stack) plus what the credentials can reach: these tests keep the workflow on
environment secrets only and every previewed stack free of an SSH key, so even a preview that
decrypts its stack's secrets cannot reach the hosts.

The scheduler image's workflows: built on every change to what goes into it, published and
signed only from a version tag, by the one job that holds the registry and OIDC permissions.
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


# ------------------------------------------------------------- the scheduler image

WORKFLOWS = ROOT / ".github" / "workflows"
IMAGE_BUILD = WORKFLOWS / "scheduler-image.yml"
RELEASE = WORKFLOWS / "release.yml"


def _load(path: Path) -> dict[Any, Any]:
    return dict(yaml.safe_load(path.read_text()))


def _steps(path: Path, job: str) -> list[dict[str, Any]]:
    return list(_load(path)["jobs"][job]["steps"])


def _run(path: Path, job: str) -> str:
    return "\n".join(str(s.get("run", "")) for s in _steps(path, job))


def test_every_action_is_pinned_to_a_version() -> None:
    for path in WORKFLOWS.glob("*.yml"):
        for job in _load(path)["jobs"].values():
            for step in job["steps"]:
                if "uses" in step:
                    assert re.fullmatch(r"[\w.-]+/[\w./-]+@v\d+(\.\d+)*", step["uses"]), (
                        path.name,
                        step["uses"],
                    )


def test_scheduler_image_builds_on_every_change_to_the_scheduler_or_its_build() -> None:
    on = _load(IMAGE_BUILD)[True]
    assert set(on) == {"push", "pull_request"}
    for event in on.values():
        assert {
            "scheduler/**",
            "tools/build-scheduler-image.sh",
            "tools/build-tools.sh",
            "tools/build-lib.sh",
            "tools/go/ko/**",
        } <= set(event["paths"])
    assert _load(IMAGE_BUILD)["permissions"] == {"contents": "read"}


def test_scheduler_image_runs_the_make_target_and_keeps_the_archive() -> None:
    assert "make scheduler-image" in _run(IMAGE_BUILD, "scheduler-image")
    job = _load(IMAGE_BUILD)["jobs"]["scheduler-image"]
    (upload,) = [
        s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    images_dir = job["env"]["GPU_CLUSTER_IMAGES_DIR"].removeprefix("${{ github.workspace }}/")
    assert f"{images_dir}/gpu-binpack-scheduler-*.tar" in upload["with"]["path"].split()
    assert upload["with"]["if-no-files-found"] == "error"


def test_release_runs_only_on_version_tags_with_least_privilege() -> None:
    release = _load(RELEASE)
    assert release[True] == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {}
    (job,) = release["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}


def test_release_pushes_to_the_repository_s_registry_tagged_by_release_and_kubernetes() -> None:
    run = _run(RELEASE, "scheduler-image")
    assert 'KO_DOCKER_REPO="ghcr.io/${GITHUB_REPOSITORY,,}/gpu-binpack-scheduler"' in run
    assert "k8s.io/kubernetes" in run  # K8S_VERSION from scheduler/go.mod, as .ko.yaml expects
    assert '--tags "${GITHUB_REF_NAME},${K8S_VERSION}"' in run
    assert "../.tools/bin/ko build ./cmd/kube-scheduler --bare" in run


def test_release_signs_the_pushed_digest_keylessly() -> None:
    steps = _steps(RELEASE, "scheduler-image")
    (installer,) = [
        s for s in steps if str(s.get("uses", "")).startswith("sigstore/cosign-installer")
    ]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", installer["with"]["cosign-release"])
    (sign,) = [s for s in steps if "cosign sign" in str(s.get("run", ""))]
    # ko prints <repository>@sha256:<digest>: the signature names the digest, not a movable tag.
    assert sign["env"]["IMAGE"] == "${{ steps.push.outputs.image }}"
    assert sign["run"] == 'cosign sign --yes "${IMAGE}"'
    assert "--key" not in sign["run"]
    push = next(s for s in steps if s.get("id") == "push")
    assert 'echo "image=${image}" >> "${GITHUB_OUTPUT}"' in push["run"]
