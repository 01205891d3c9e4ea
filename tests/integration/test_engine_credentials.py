"""Which credentials the node layers use under the real Pulumi engine.

- A configured kubeconfig path that does not exist on the machine running the stack stops the
  run: it never falls back to $KUBECONFIG or ~/.kube/config, which name whatever cluster the
  user last worked on. Here that fallback reaches the same local cluster, so acting on it
  would show on the nodes.
- Plain `pulumi refresh`/`pulumi destroy` do not run the program, and the engine then
  configures a dynamic provider with the configuration saved by the last `up` (it does so for
  every provider). After the credentials changed (a revoked token, a rotated certificate
  stored as content), such a run fails with the API server's 401 and says what to run;
  `--run-program` uses the current configuration.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from components.kubeconfig import KUBECONFIG_KEY
from tests.integration.conftest import require_tools
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.fake_nodes import create_nodes, inventory_nodes, snapshot
from tools.harness.pulumi_engine import (
    PULUMI_ENGINE_TOOLS,
    inline_stack,
    node_layers_program,
    stack_file_config,
    use_cluster,
)

CONFIG = stack_file_config("local", {"grafanaAdminPassword": "local-only-password"})
NODES = [*CONFIG.gpu_pool.nodes, *CONFIG.extended_resources]


@pytest.fixture
def cluster() -> Iterator[tuple[LocalControlPlane, Any]]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        create_nodes(api_client, inventory_nodes(CONFIG))
        try:
            yield cp, api_client
        finally:
            api_client.close()


def _stack(cp: LocalControlPlane, state: Path, kubeconfig: str) -> auto.Stack:
    stack = inline_stack("gpu-cluster-engine", "creds", node_layers_program(CONFIG), state)
    use_cluster(stack, kubeconfig)
    return stack


def _token_kubeconfig(cp: LocalControlPlane, api_client: Any, name: str) -> str:
    """A kubeconfig with a ServiceAccount token bound to cluster-admin (another machine's)."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(
        "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    request: Any = core.create_namespaced_service_account_token(
        name, "default", client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec())
    )
    client.RbacAuthorizationV1Api(api_client).create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace="default")],
        )
    )
    return cp.kubeconfig_yaml(user={"token": request.status.token})


def _wait_refused(kubeconfig: str, timeout: float = 30) -> None:
    """Until the API server refuses the revoked token (it learns of the deletion shortly after)."""
    revoked = config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.CoreV1Api(revoked).list_node(limit=1)
            except ApiException as exc:
                if exc.status == 401:
                    return
                raise
            assert time.monotonic() < deadline, "the revoked token is still accepted"
            time.sleep(0.5)
    finally:
        revoked.close()


def test_a_missing_kubeconfig_path_stops_the_run_instead_of_using_the_default(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp, api_client = cluster
    stack = _stack(cp, tmp_path / "state", cp.kubeconfig_yaml())
    stack.up()
    applied = snapshot(api_client, NODES)

    # The machine's default kubeconfig reaches a cluster; the stack names a file it lacks.
    default = tmp_path / "default.conf"
    default.write_text(cp.kubeconfig_yaml())
    monkeypatch.setenv("KUBECONFIG", str(default))
    stack.set_config(KUBECONFIG_KEY, auto.ConfigValue(str(tmp_path / "moved-away.conf")))
    wanted = "gpu-cluster:kubeconfig: the configured kubeconfig file does not exist"
    for run in (stack.preview, lambda: stack.destroy(run_program=True)):
        with pytest.raises(auto.CommandError) as excinfo:
            run()
        assert wanted in str(excinfo.value)
        assert snapshot(api_client, NODES) == applied  # nothing touched

    # The failed run saved the provider configuration it was given: the way out is the current
    # configuration, through the program.
    use_cluster(stack, cp.kubeconfig_yaml())
    stack.destroy(run_program=True)
    assert all(
        "nvidia.com/gpu" not in str(n["taints"]) for n in snapshot(api_client, NODES).values()
    )


def test_destroy_after_revoked_credentials_says_what_to_run_and_run_program_finishes(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    cp, api_client = cluster
    before = snapshot(api_client, NODES)
    laptop = _token_kubeconfig(cp, api_client, "laptop")
    stack = _stack(cp, tmp_path / "state", laptop)
    stack.up()
    # The token is revoked (its ServiceAccount deleted); the stack now names valid credentials.
    client.CoreV1Api(api_client).delete_namespaced_service_account("laptop", "default")
    _wait_refused(laptop)
    use_cluster(stack, cp.kubeconfig_yaml())

    with pytest.raises(auto.CommandError) as excinfo:
        stack.destroy()
    message = str(excinfo.value)
    assert "HTTP 401" in message and "pulumi destroy --run-program" in message

    stack.destroy(run_program=True)
    assert snapshot(api_client, NODES) == before
