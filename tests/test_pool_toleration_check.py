"""The preview's question to the cluster for a refusing engine that the stack's own admission
plugins leave without the pool's toleration: does the API server add it (a dry-run GPU pod,
components/opa_gate/preview.py check_pool_toleration)? Against a fake API (tests/fake_cluster.py)
and a loopback HTTP server, and wired into the whole program under Pulumi mocks.
tests/integration/test_pool_toleration_probe_live.py asks real kube-apiservers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pulumi
import pytest
import yaml

from components import cluster_access
from components.cluster_access import pod_dry_run
from components.opa_gate.preview import PROBE_NAMESPACE, check_pool_toleration, toleration_probe
from components.opa_gate.settings import EXTENDED_RESOURCE_TOLERATION
from stack_config import ConfigError
from tests.conftest import Recording, run_program
from tests.fake_cluster import FakeCluster, monitoring_ready_cluster, reply_json

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
REFUSED = "came back without the toleration nvidia.com/gpu Exists NoSchedule"


def _check(fake: FakeCluster, monkeypatch: pytest.MonkeyPatch, engine: str = "opa") -> str | None:
    monkeypatch.setattr(cluster_access, "pod_dry_run", lambda kubeconfig, context: fake.dry_run_pod)
    return check_pool_toleration(
        "", None, engine=engine, kubernetes_version="v1.35.4", taint=TAINT, resource=GPU
    )


# ------------------------------------------------------------------ check_pool_toleration


def test_pool_toleration_check_passes_when_the_api_server_adds_the_toleration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCluster(admission_plugins=[EXTENDED_RESOURCE_TOLERATION])
    assert _check(fake, monkeypatch) is None
    # One dry-run, in the namespace the gate never judges, of a pod with no toleration.
    ((namespace, pod),) = fake.dry_runs
    assert namespace == PROBE_NAMESPACE == "kube-system"
    assert pod == toleration_probe(GPU)
    assert "tolerations" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}


@pytest.mark.parametrize("engine", ["opa", "validating-admission-policy"])
def test_pool_toleration_check_refuses_when_it_does_not(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as refused:
        _check(FakeCluster(), monkeypatch, engine)
    (problem,) = refused.value.problems
    assert (problem.key, problem.value) == ("admission.engine", engine)
    assert REFUSED in problem.allowed


@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (FakeCluster(unreachable=True), "connection refused"),
        (
            FakeCluster(refuse_pods='pods is forbidden: User "ci" cannot create resource'),
            'HTTP 403: pods is forbidden: User "ci" cannot create resource',
        ),
    ],
    ids=["unreachable", "refused"],
)
def test_pool_toleration_check_that_cannot_ask_is_a_warning(
    fake: FakeCluster, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    warning = _check(fake, monkeypatch)
    assert warning == (
        "gpu-cluster:admission.engine opa was not checked against the cluster: a dry-run create "
        "of a pod asking for nvidia.com/gpu (POST /api/v1/namespaces/kube-system/pods"
        f"?dryRun=All, which needs pod create there) failed: {reason}. This engine adds no "
        "toleration: unless the API servers run ExtendedResourceToleration "
        "(--enable-admission-plugins), GPU pods asking for nvidia.com/gpu never tolerate the "
        "pool's taint nvidia.com/gpu=present:NoSchedule and stay Pending. Check that `kubectl "
        "create --dry-run=server -o yaml` of such a pod comes back with the toleration "
        "nvidia.com/gpu Exists NoSchedule"
    )


# ------------------------------------------------------------------ the request on the wire


class _Pods(BaseHTTPRequestHandler):
    """Answers POST .../pods as an API server would: with ExtendedResourceToleration's
    toleration (namespace ert), without it (any other), or 403 (namespace forbidden)."""

    seen: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        pod = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, pod))
        status = 201
        if "/forbidden/" in self.path:
            status = 403
            answer: dict[str, Any] = {"kind": "Status", "message": "pods is forbidden: no"}
        else:
            answer = dict(pod)
            if "/ert/" in self.path:
                answer["spec"] = {**pod["spec"], "tolerations": [dict(TOLERATION)]}
        reply_json(self, status, answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def pods_server(tmp_path: Path) -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Pods)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Pods.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _kubeconfig(server: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "test-token"}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
    )


def test_pool_toleration_dry_run_posts_the_pod_with_dry_run_all(pods_server: str) -> None:
    create = pod_dry_run(_kubeconfig(pods_server), None)
    answer = create("ert", toleration_probe(GPU))
    assert answer["spec"]["tolerations"] == [TOLERATION]
    ((path, pod),) = _Pods.seen
    assert path == "/api/v1/namespaces/ert/pods?dryRun=All"
    assert pod == toleration_probe(GPU)
    with pytest.raises(Exception, match=r"^HTTP 403: pods is forbidden: no$"):
        create("forbidden", toleration_probe(GPU))


# ------------------------------------------------------------------ wired into the program

# The dev stack (v1.36, validating-admission-policy) and the prod one (v1.35, opa), each
# without ControlPlaneFeatures: the stack enables no admission plugin.
NO_CONTROL_PLANE = {"controlPlane": {"enabled": False}}
STACKS = [
    pytest.param("dev", {}, id="dev-v1.36-validating-admission-policy"),
    pytest.param(
        "prod",
        {"admission": {"engine": "validating-admission-policy", "gateExtendedResources": False}},
        id="prod-v1.35-validating-admission-policy",
    ),
    pytest.param("prod", {}, id="prod-v1.35-opa"),
    pytest.param("dev", {"admission": {"engine": "opa"}}, id="dev-v1.36-opa"),
    pytest.param(
        "dev",
        {"kubernetesVersion": "v1.37.2", "admission": {"engine": "opa"}},
        id="dev-v1.37-opa",
    ),
]


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    logged: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: logged.append(message))
    return logged


def _cluster(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> FakeCluster:
    """The dev and prod stacks' cluster (claimed, `monitoring` made by someone else), whose
    dry-runs the preview's toleration check makes."""
    fake = monitoring_ready_cluster()
    for name, value in kwargs.items():
        setattr(fake, name, value)
    monkeypatch.setattr(cluster_access, "pod_dry_run", lambda kubeconfig, context: fake.dry_run_pod)
    return fake


@pytest.fixture(autouse=True)
def _kubeconfig_env(empty_kubeconfig_env: Path) -> None:
    """Every program run reads this throwaway kubeconfig, never the developer's."""


@pytest.mark.parametrize(("stack", "overrides"), STACKS)
def test_pool_toleration_program_loads_where_the_api_server_adds_it(
    stack: str,
    overrides: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    warnings: list[str],
) -> None:
    fake = _cluster(monkeypatch, admission_plugins={EXTENDED_RESOURCE_TOLERATION})
    recording = run_program(stack, {**NO_CONTROL_PLANE, **overrides}, cluster=fake)
    assert recording.outputs["admissionEngine"] == (
        overrides.get("admission", {}).get("engine")
        or {"dev": "validating-admission-policy", "prod": "opa"}[stack]
    )
    assert [namespace for namespace, _ in fake.dry_runs] == [PROBE_NAMESPACE]
    assert not [w for w in warnings if "admission.engine" in w]


@pytest.mark.parametrize(("stack", "overrides"), STACKS)
def test_pool_toleration_program_refuses_before_declaring_anything_where_it_does_not(
    stack: str, overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _cluster(monkeypatch)
    recording = Recording()
    with pytest.raises(ConfigError) as refused:
        run_program(stack, {**NO_CONTROL_PLANE, **overrides}, recording, cluster=fake)
    (problem,) = refused.value.problems
    assert problem.key == "admission.engine" and REFUSED in problem.allowed
    assert recording.resources == []


def test_pool_toleration_program_out_of_reach_warns_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, warnings: list[str]
) -> None:
    # The ownership check's reads answer; the dry-run does not (a CI preview without access).
    fake = _cluster(monkeypatch)
    out_of_reach = FakeCluster(unreachable=True)
    monkeypatch.setattr(
        cluster_access, "pod_dry_run", lambda kubeconfig, context: out_of_reach.dry_run_pod
    )
    recording = run_program("dev", NO_CONTROL_PLANE, cluster=fake)
    assert len(out_of_reach.dry_runs) == 1
    assert recording.outputs["admissionEngine"] == "validating-admission-policy"
    (warning,) = [w for w in warnings if w.startswith("gpu-cluster:admission.engine")]
    assert "was not checked against the cluster" in warning
    assert "failed: connection refused" in warning


def test_pool_toleration_program_asks_the_cluster_only_where_the_config_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # {what the dev stack is given: whether the preview asks the cluster}.
    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("the stack's own plugin", {}, False),
        (
            "the routing engine",
            {**NO_CONTROL_PLANE, "admission": {"engine": "mutating-admission-policy"}},
            False,
        ),
        (
            "a PreferNoSchedule pool",
            {
                **NO_CONTROL_PLANE,
                "gpuPool": {"nodes": ["lab-gpu-1"], "taint": {"effect": "PreferNoSchedule"}},
            },
            False,
        ),
        ("a refusing engine, no plugin of the stack's", NO_CONTROL_PLANE, True),
    ]
    for what, overrides, asked in cases:
        fake = _cluster(monkeypatch, admission_plugins={EXTENDED_RESOURCE_TOLERATION})
        run_program("dev", overrides, cluster=fake)
        assert bool(fake.dry_runs) == asked, what
