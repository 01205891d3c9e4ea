"""scheduler.gangScheduling without ControlPlaneFeatures: the preview asks the live API server
whether it serves PodGroups (components/cluster_access.py check_served_api), on real ones."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from components.binpack_scheduler.settings import (
    GANG_GROUP_VERSION,
    GANG_RESOURCE,
)
from components.cluster_access import check_served_api
from components.settings import ConfigError
from tools.harness import LocalControlPlane

KEY = "scheduler.gangScheduling"


def _check(cp: LocalControlPlane) -> str | None:
    return check_served_api(
        cp.kubeconfig_path.read_text(), None, KEY, GANG_GROUP_VERSION, GANG_RESOURCE, "turn it on"
    )


def test_an_api_server_without_podgroups_refuses_gangs_naming_the_key(
    control_plane_factory: Callable[..., LocalControlPlane],
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _check(control_plane_factory([]))
    (problem,) = excinfo.value.problems
    assert str(problem) == (
        f"gpu-cluster:{KEY}: got True; the cluster does not serve {GANG_RESOURCE} in "
        f"{GANG_GROUP_VERSION}; turn it on"
    )


def test_an_api_server_with_what_gangs_need_serves_podgroups(
    control_plane: LocalControlPlane,
) -> None:
    # The session's control plane runs with GANG_APISERVER_FLAGS (tests/integration/conftest.py).
    assert _check(control_plane) is None


def test_an_unreachable_cluster_is_a_warning_not_a_refusal(
    control_plane: LocalControlPlane,
) -> None:
    kubeconfig = control_plane.kubeconfig_path.read_text().replace(
        control_plane.server, "https://127.0.0.1:1"
    )
    warning = check_served_api(kubeconfig, None, KEY, GANG_GROUP_VERSION, GANG_RESOURCE, "x")
    assert warning is not None
    assert warning.startswith(f"gpu-cluster:{KEY} was not checked against the cluster: GET /apis/")
