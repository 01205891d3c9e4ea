"""A namespace the stack uses without creating it (`gpuOperator.createNamespace: false`) must
carry what the operator's pods need (Pod Security's enforce level privileged; with allocation
dra, DRA admin access): the whole program under Pulumi mocks, its ownership check reading a real
kube-apiserver (tests/test_ownership.py has the same against the in-memory cluster; the real
engine, tests/e2e/test_shared_cluster.py, is left to the namespace that exists or not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes import client

from components.gpu_operator.manifests import POD_SECURITY_ENFORCE
from components.gpu_operator.settings import DRA_ADMIN_NAMESPACE_LABEL
from components.ownership import OwnershipError, api_get
from components.providers.node_api import api_client_from_kubeconfig
from tests.conftest import run_program
from tests.fake_cluster import FakeCluster
from tools.harness.pulumi_engine import project_config

from .conftest import ControlPlaneFactory

NAMESPACE = "team-gpu"


class LiveCluster(FakeCluster):
    """The ownership check's reads, answered by a real API server (as components/ownership.py
    `connect` reads it, from kubeconfig content)."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__()
        self._live = api_get(api_client_from_kubeconfig(kubeconfig, None))

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> Any:
        self.reads.append(path)
        return self._live(path, query)


def _overrides(allocation: str) -> dict[str, Any]:
    """The local stack with its operator in NAMESPACE, used without creating it; no monitoring
    (it needs a password these tests do not set)."""
    local = project_config("local")
    operator = {**local["gpuOperator"], "namespace": NAMESPACE, "createNamespace": False}
    if allocation == "dra":
        operator.update(allocation="dra", version="v26.7.0")
    return {"gpuOperator": operator, "monitoring": {**local["monitoring"], "enabled": False}}


def _label(core: Any, labels: dict[str, str | None]) -> None:
    core.patch_namespace(NAMESPACE, {"metadata": {"labels": labels}})


def _refused_labels(cluster: LiveCluster, allocation: str) -> list[str]:
    """The labels the program's check says NAMESPACE lacks (none when it goes on)."""
    try:
        run_program("local", _overrides(allocation), cluster=cluster)
    except OwnershipError as refused:
        assert {(p.key, p.value) for p in refused.problems} == {
            ("gpuOperator.namespace", NAMESPACE)
        }, str(refused)
        return [p.allowed.split(" must carry ")[1].split("=")[0] for p in refused.problems]
    return []


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_used_namespace_live_refused_until_labelled(
    control_plane_factory: ControlPlaneFactory,
) -> None:
    """An existing namespace as a team makes it (the API server adds only its name label) is
    refused, naming the label, its value and the kubectl command; another Pod Security level
    too; labelled as the layer would label it, the program goes on. With allocation dra the
    admin-access label is asked for as well."""
    cp = control_plane_factory()
    core = client.CoreV1Api(cp.api_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    cluster = LiveCluster(cp.kubeconfig_yaml())

    with pytest.raises(OwnershipError) as refused:
        run_program("local", _overrides("device-plugin"), cluster=cluster)
    assert (
        f"gpu-cluster:gpuOperator.namespace: got '{NAMESPACE}'; namespace {NAMESPACE} has no "
        f"label {POD_SECURITY_ENFORCE}; with gpuOperator.createNamespace: false it must carry "
        f"{POD_SECURITY_ENFORCE}=privileged"
    ) in str(refused.value)
    assert f"`kubectl label namespace {NAMESPACE} {POD_SECURITY_ENFORCE}=privileged`" in str(
        refused.value
    )
    assert f"/api/v1/namespaces/{NAMESPACE}" in cluster.reads

    _label(core, {POD_SECURITY_ENFORCE: "baseline"})
    assert _refused_labels(cluster, "device-plugin") == [POD_SECURITY_ENFORCE]
    assert _refused_labels(cluster, "dra") == [POD_SECURITY_ENFORCE, DRA_ADMIN_NAMESPACE_LABEL]

    _label(core, {POD_SECURITY_ENFORCE: "privileged"})
    assert _refused_labels(cluster, "device-plugin") == []
    assert _refused_labels(cluster, "dra") == [DRA_ADMIN_NAMESPACE_LABEL]

    _label(core, {DRA_ADMIN_NAMESPACE_LABEL: "true"})
    assert _refused_labels(cluster, "dra") == []
