"""The version skew check against a fake /version server (a real HTTP server on loopback that
answers only GET /version, which is all the check reads); the annotations every object of the
stack is applied with (the whole program's: tests/test_ownership.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from components.cluster_access import (
    PATCH_FORCE,
    _forced,
    check_version_skew,
    scheduler_skew_problem,
    scheduler_skew_warning,
)
from components.ownership import STACK_MARK
from stack_config import ConfigError
from tests.conftest import Recording, run_program
from tests.fake_cluster import reply_json

# What kube-apiserver v1.37.2 answers at /version (every field the client requires).
VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.2",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-10-01T00:00:00Z",
    "goVersion": "go1.26.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


class _Version(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path.rstrip("/") == "/version" else 404
        reply_json(self, status, VERSION)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _kubeconfig(path: Path, server: str, context: str = "ctx") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "test-token"}}],
                "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
                "current-context": context,
            }
        )
    )
    return path


@pytest.fixture
def version_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Version)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("scheduler", ["v1.37.2", "v1.37.0", "v1.37.9", "v1.36.5"])
def test_cluster_access_scheduler_at_or_one_minor_below_the_api_server_fits(
    scheduler: str,
) -> None:
    assert scheduler_skew_problem(scheduler, "v1.37.2") is None


@pytest.mark.parametrize("scheduler", ["v1.38.0", "v1.40.1", "v2.37.0"])
def test_cluster_access_scheduler_newer_than_the_api_server_is_refused(scheduler: str) -> None:
    problem = scheduler_skew_problem(scheduler, "v1.37.2")
    assert problem is not None
    assert str(problem) == (
        f"gpu-cluster:kubernetesVersion: got '{scheduler}'; the cluster's API server is "
        "v1.37.2, and the binpack kube-scheduler (this version) may not be newer than the "
        "kube-apiserver (Kubernetes version skew policy); allowed: v1.36.x or v1.37.x"
    )


def test_cluster_access_scheduler_two_minors_older_is_a_warning() -> None:
    assert scheduler_skew_problem("v1.35.4", "v1.37.2") is None
    assert scheduler_skew_warning("v1.35.4", "v1.37.2") == (
        "gpu-cluster:kubernetesVersion v1.35.4 is more than 1 minor version older than the "
        "cluster's API server (v1.37.2), outside the Kubernetes version skew policy; set it to "
        "v1.36.x or v1.37.x"
    )
    assert scheduler_skew_warning("v1.36.0", "v1.37.2") is None


def test_cluster_access_reads_a_distributions_git_version() -> None:
    assert scheduler_skew_problem("v1.37.2", "v1.37.2+k3s1") is None
    assert scheduler_skew_problem("v1.38.0", "v1.37.2-eks-1234") is not None


def test_cluster_access_checks_the_live_version(version_server: str, tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", version_server).read_text()
    assert check_version_skew(kubeconfig, None, "v1.37.2") is None
    assert check_version_skew(kubeconfig, None, "v1.35.4") == scheduler_skew_warning(
        "v1.35.4", "v1.37.2"
    )
    with pytest.raises(
        ConfigError, match=r"got 'v1\.38\.1'; the cluster's API server is v1\.37\.2"
    ):
        check_version_skew(kubeconfig, None, "v1.38.1")


def test_cluster_access_unreachable_cluster_skips_with_a_warning(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Version)
    closed = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", closed).read_text()
    warning = check_version_skew(kubeconfig, None, "v1.38.1")
    assert warning is not None
    assert warning.startswith(
        "gpu-cluster:kubernetesVersion v1.38.1 was not compared with the cluster's version: "
        "GET /version failed: "
    )


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_cluster_access_program_refuses_a_newer_scheduler_before_declaring_anything(
    version_server: str, tmp_path: Path
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "lab", version_server, context="kubernetes-admin@lab")
    recording = Recording()
    with pytest.raises(ConfigError, match=r"kubernetesVersion: got 'v1\.38\.0'"):
        run_program(
            "dev", {"kubeconfig": str(kubeconfig), "kubernetesVersion": "v1.38.0"}, recording
        )
    assert recording.resources == []


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, {"annotations": {STACK_MARK: "id-1", PATCH_FORCE: "true"}}),
        (
            {"name": "x", "annotations": {"team": "a", STACK_MARK: "forged"}},
            {"name": "x", "annotations": {"team": "a", STACK_MARK: "id-1", PATCH_FORCE: "true"}},
        ),
    ],
    ids=["none", "dict"],
)
def test_cluster_access_every_object_is_forced_and_marked_as_the_stacks(
    metadata: dict[str, object] | None, expected: dict[str, object]
) -> None:
    """patchForce and the stack's mark, over whatever the layer set (a mark included)."""
    assert _forced(metadata, {STACK_MARK: "id-1"}) == expected


def test_cluster_access_object_meta_args_are_forced_and_marked_too() -> None:
    import pulumi_kubernetes as k8s

    meta = k8s.meta.v1.ObjectMetaArgs(name="x", annotations={"team": "a"})
    forced = _forced(meta, {STACK_MARK: "id-1"})
    assert forced.annotations == {"team": "a", STACK_MARK: "id-1", PATCH_FORCE: "true"}
    assert meta.annotations == {"team": "a"}  # the layer's own metadata is left as it was
