"""The preview's question to the cluster (components/opa_gate/preview.py check_pool_toleration)
asked of real kube-apiservers: a dry-run create of a pod asking for nvidia.com/gpu tells
whether the API server runs ExtendedResourceToleration, which a refusing engine relies on when
the stack does not enable the plugin itself.

Two API servers, the session's (the plugin off, as kube-apiserver defaults) and one started
with --enable-admission-plugins=ExtendedResourceToleration: the check passes on one and refuses
on the other; a gate of this stack already in force (an earlier `up`) changes neither answer,
since the probe runs in kube-system, which every engine leaves alone; a probe the cluster
refuses (another admission policy), or a cluster out of reach, is a warning, not a refusal.
"""

from __future__ import annotations

import contextlib
import re
import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from components.opa_gate.manifests import gate_data
from components.opa_gate.preview import PROBE_NAMESPACE, check_pool_toleration
from components.opa_gate.settings import EXTENDED_RESOURCE_TOLERATION, ROUTING_ENGINE
from components.settings import ConfigError
from components.tainted_gpu_pool.settings import Taint
from tests.integration.conftest import require_tools
from tests.integration.gate_live import Gate, engine_active, wait_for
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
SCHEDULER = "gpu-binpack-scheduler"
REFUSED = "came back without the toleration nvidia.com/gpu Exists NoSchedule"
API = "/apis/admissionregistration.k8s.io/v1"


def _ready(cp: LocalControlPlane) -> LocalControlPlane:
    """`cp` with kube-system's default ServiceAccount, which kube-controller-manager creates on
    a real cluster (the ServiceAccount admission plugin refuses pods without it)."""
    with contextlib.suppress(urllib.error.HTTPError):  # already there
        cp.request(
            "POST",
            f"/api/v1/namespaces/{PROBE_NAMESPACE}/serviceaccounts",
            {"metadata": {"name": "default"}},
        )
    return cp


@pytest.fixture(scope="module")
def with_plugin() -> Iterator[LocalControlPlane]:
    require_tools(*CONTROL_PLANE_TOOLS)
    flag = f"--enable-admission-plugins={EXTENDED_RESOURCE_TOLERATION}"
    with LocalControlPlane([flag]) as cp:
        yield _ready(cp)


@pytest.fixture
def without_plugin(control_plane: LocalControlPlane) -> LocalControlPlane:
    return _ready(control_plane)


def _check(cp: LocalControlPlane, engine: str = "validating-admission-policy") -> str | None:
    return check_pool_toleration(
        cp.kubeconfig_path.read_text(),
        None,
        engine=engine,
        kubernetes_version="v1.37.2",
        taint=TAINT,
        resource=GPU,
    )


def test_pool_toleration_probe_live_an_api_server_with_the_plugin_passes(
    with_plugin: LocalControlPlane,
) -> None:
    assert _check(with_plugin) is None
    assert _check(with_plugin, "opa") is None


def test_pool_toleration_probe_live_an_api_server_without_it_is_refused(
    without_plugin: LocalControlPlane,
) -> None:
    with pytest.raises(ConfigError) as refused:
        _check(without_plugin)
    (problem,) = refused.value.problems
    assert (problem.key, problem.value) == ("admission.engine", "validating-admission-policy")
    assert REFUSED in problem.allowed


@contextlib.contextmanager
def _gate(cp: LocalControlPlane, engine: str) -> Iterator[None]:
    """This stack's gate, `engine`, in force on `cp` (as an earlier `up` left it)."""
    namespace = f"probe-gate-{uuid.uuid4().hex[:6]}"
    cp.create_namespace(namespace)
    gate = Gate(
        config=gate_data(
            SCHEDULER, [], [], pool_toleration=Taint.model_validate(TAINT).toleration()
        ),
        namespace=f"gate-own-{uuid.uuid4().hex[:6]}",
    )
    api_client = cp.api_client()
    try:
        with engine_active(engine, cp, api_client, namespace, gate):
            yield
    finally:
        api_client.close()
        for name in (namespace, gate.namespace):
            with contextlib.suppress(Exception):
                cp.request("DELETE", f"/api/v1/namespaces/{name}")


def test_pool_toleration_probe_live_a_refusing_gate_in_force_does_not_stop_the_probe(
    with_plugin: LocalControlPlane,
) -> None:
    # The gate refuses a GPU pod that leaves schedulerName unset, as the probe does, but not
    # in kube-system: the answer stays a definite pass, not a warning.
    with _gate(with_plugin, "validating-admission-policy"):
        assert _check(with_plugin) is None


def test_pool_toleration_probe_live_a_routing_gate_in_force_does_not_fool_the_probe(
    without_plugin: LocalControlPlane,
) -> None:
    # The routing gate (an earlier config's) gives GPU pods the pool's toleration, but neither
    # in kube-system nor as the plugin's: the cluster is still found without the plugin.
    with _gate(without_plugin, ROUTING_ENGINE), pytest.raises(ConfigError, match=REFUSED):
        _check(without_plugin)


@contextlib.contextmanager
def _denying_pods_in_the_probe_namespace(cp: LocalControlPlane) -> Iterator[str]:
    """A ValidatingAdmissionPolicy of someone else's that refuses every pod created in
    kube-system; yields its message."""
    name = f"no-pods-{uuid.uuid4().hex[:6]}"
    message = "no new pods in kube-system"
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROBE_NAMESPACE}},
        },
        "validations": [{"expression": "false", "message": message}],
    }
    binding = {"policyName": name, "validationActions": ["Deny"]}
    cp.request(
        "POST", f"{API}/validatingadmissionpolicies", {"metadata": {"name": name}, "spec": spec}
    )
    try:
        cp.request(
            "POST",
            f"{API}/validatingadmissionpolicybindings",
            {"metadata": {"name": name}, "spec": binding},
        )
        try:
            yield message
        finally:
            cp.request("DELETE", f"{API}/validatingadmissionpolicybindings/{name}")
    finally:
        cp.request("DELETE", f"{API}/validatingadmissionpolicies/{name}")


def test_pool_toleration_probe_live_a_refused_probe_is_a_warning(
    with_plugin: LocalControlPlane,
) -> None:
    seen: list[str | None] = [None]

    def warned() -> bool:
        seen[0] = _check(with_plugin)
        return seen[0] is not None

    with _denying_pods_in_the_probe_namespace(with_plugin) as message:
        wait_for("the probe refused", warned, lambda: f"last answer: {seen[0]!r}")
        warning = seen[0]
        assert warning is not None
        assert warning.startswith(
            "gpu-cluster:admission.engine validating-admission-policy was not checked against "
            "the cluster: a dry-run create of a pod asking for nvidia.com/gpu"
        )
        # A policy's denial is 422, and names the policy.
        assert re.search(
            r"failed: HTTP 422: pods \"gpu-cluster-toleration-probe-\w+\" is forbidden: "
            rf"ValidatingAdmissionPolicy '[\w-]+' with binding '[\w-]+' denied request: {message}\.",
            warning,
        ), warning
    wait_for("the probe admitted again", lambda: _check(with_plugin) is None, lambda: "")


def test_pool_toleration_probe_live_an_unreachable_cluster_is_a_warning(
    without_plugin: LocalControlPlane,
) -> None:
    kubeconfig = without_plugin.kubeconfig_path.read_text().replace(
        without_plugin.server, "https://127.0.0.1:1"
    )
    warning = check_pool_toleration(
        kubeconfig, None, engine="opa", kubernetes_version="v1.37.2", taint=TAINT, resource=GPU
    )
    assert warning is not None
    assert warning.startswith("gpu-cluster:admission.engine opa was not checked against the")
