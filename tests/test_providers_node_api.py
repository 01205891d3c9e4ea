"""The shared node machinery: retry loop, error messages, kubeconfig flattening, the stack's id."""

from __future__ import annotations

import base64
from pathlib import Path

import pulumi
import pytest
import yaml

from components.kubeconfig import flatten_kubeconfig
from components.providers.node_api import (
    Conflict,
    NodeApiError,
    NodeNotFound,
    StackIdentityProvider,
    _api_error,
    json_pointer_escape,
    stack_identity,
    update_node,
)
from tests.conftest import register
from tests.fake_node_api import FakeNodeApi


def test_node_api_escapes_json_pointer_tokens() -> None:
    assert json_pointer_escape("example.com/dongle") == "example.com~1dongle"
    assert json_pointer_escape("a~b/c") == "a~0b~1c"


def test_node_api_update_gives_up_after_repeated_conflicts() -> None:
    api = FakeNodeApi({"n": {}})
    api.before_write = lambda name: api.edit(name, lambda node: None)
    with pytest.raises(Conflict):
        update_node(
            api,
            "n",
            lambda node: {"spec": {"unschedulable": True}},
            attempts=3,
            sleep=lambda s: None,
        )


def test_node_api_update_skips_the_write_when_mutate_returns_none() -> None:
    api = FakeNodeApi({"n": {}})
    update_node(api, "n", lambda node: None)
    assert api.writes == 0


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        (404, NodeNotFound, "node 'gpu-1' not found on API server https://10.0.0.1:6443"),
        (
            401,
            NodeApiError,
            "API server https://10.0.0.1:6443 refused the credentials to read node 'gpu-1' (HTTP 401): Unauthorized",
        ),
        (
            403,
            NodeApiError,
            "API server https://10.0.0.1:6443 refused the credentials to read node 'gpu-1' (HTTP 403): Unauthorized",
        ),
        (409, Conflict, "node 'gpu-1' changed on API server https://10.0.0.1:6443"),
    ],
)
def test_node_api_errors_name_node_and_server(status: int, kind: type, message: str) -> None:
    error = _api_error(status, "Unauthorized", "gpu-1", "read", "https://10.0.0.1:6443")
    assert isinstance(error, kind)
    assert str(error).startswith(message)


def test_node_api_flatten_inlines_certificate_files(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "admin.key").write_bytes(b"KEY")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://x", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {"client-key": "admin.key", "client-certificate-data": "Q0VSVA=="},
                    }
                ],
            }
        )
    )
    flat = yaml.safe_load(flatten_kubeconfig(kubeconfig))
    assert flat["clusters"][0]["cluster"] == {
        "server": "https://x",
        "certificate-authority-data": base64.b64encode(b"CA").decode(),
    }
    assert flat["users"][0]["user"] == {
        "client-certificate-data": "Q0VSVA==",
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }


IDENTITY = "pulumi-python:dynamic/gpu-cluster:StackIdentity"


def test_node_api_stack_identity_is_one_resource_per_run() -> None:
    """The claim and both node layers call stack_identity(): one StackIdentity per run, and a
    new run registers its own."""
    ids: list[pulumi.Output[str]] = []
    first = register(lambda: ids.extend([stack_identity(), stack_identity()]), stack="prod")
    assert ids[0] is ids[1]
    (identity,) = first.of_type(IDENTITY)
    assert identity.name == "stack-identity"
    assert identity.inputs["label"].endswith("/gpu-cluster/prod")  # organization/...
    second = register(lambda: ids.append(stack_identity()), stack="prod")
    assert len(second.of_type(IDENTITY)) == 1 and ids[2] is not ids[0]


def test_node_api_stack_identity_is_minted_once_and_a_rename_keeps_it() -> None:
    provider = StackIdentityProvider()
    label = {"label": "organization/gpu-cluster/prod"}
    created = provider.create(dict(label))
    assert created.id != provider.create(dict(label)).id  # a new stack, a new id
    renamed = {"label": "organization/gpu-cluster/production"}
    diff = provider.diff(str(created.id), dict(created.outs or {}), renamed)
    assert (diff.changes, diff.replaces) == (True, [])
    assert provider.update(str(created.id), dict(created.outs or {}), renamed).outs == renamed
    assert provider.diff(str(created.id), renamed, dict(renamed)).changes is False
