"""Fixtures for the whole-program scenarios: each stack applied once to its own local cluster.

Every test under tests/e2e is marked ``e2e`` (and ``integration``: it needs the built tools).
Without the tools the tests skip with the reason; under CI=true a missing tool fails them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.harness.child_process import ControlPlaneError
from tools.harness.cluster import PodNetwork
from tools.harness.stack import STACK_TOOLS, AppliedStack
from tools.harness.tools import TOOLS_BIN_ENV, missing_tools, tools_bin

E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.integration)


def require_e2e_tools() -> None:
    """Skip when a tool is not built; fail instead when CI=true."""
    missing = missing_tools(STACK_TOOLS)
    if not missing:
        network = PodNetwork()
        try:  # the pod addresses need a route to this host (CAP_NET_ADMIN)
            network.claim()
        except ControlPlaneError as exc:
            if os.environ.get("CI") == "true":
                pytest.fail(str(exc), pytrace=False)
            pytest.skip(str(exc))
        network.release()
        return
    message = (
        f"{', '.join(missing)} not found in {tools_bin()}: run `make tools`"
        f" or point ${TOOLS_BIN_ENV} at a directory holding them"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def apply_stack(
    stack: str, tmp: Path, overrides: dict[str, Any] | None = None
) -> Iterator[AppliedStack]:
    """`stack` (with config `overrides`) applied to a fresh local cluster; the cluster stops
    afterwards."""
    require_e2e_tools()
    applied = AppliedStack(stack, tmp, overrides=overrides)
    with applied:
        applied.up()
        yield applied


@pytest.fixture(name="namespace")
def namespace_fixture(applied: AppliedStack) -> Iterator[str]:
    """A fresh namespace for a scenario's own pods, deleted afterwards."""
    from kubernetes import client

    name = f"scenario-{uuid.uuid4().hex[:6]}"
    core: Any = client.CoreV1Api(applied.api_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """check()'s first truthy result; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen within {timeout:.0f} s", pytrace=False)
        time.sleep(0.2)


def scheduled_by(core: Any, namespace: str, name: str) -> set[str]:
    """The components that reported scheduling the pod (its Scheduled events)."""
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason=Scheduled"
    ).items
    return {e.reporting_component or (e.source.component if e.source else "") for e in events}
