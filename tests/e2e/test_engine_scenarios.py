"""What only the real engine shows, on the local stack: diffs, drift, replacement, interruption,
a second life after destroy, and two stacks on one cluster.

The first scenarios share one applied stack (module scope) and run in file order; the later
ones start clusters of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from components.cluster_access import CLAIM_KEY, HELM_RELEASE
from components.gpu_operator import settings as gpu_operator_settings
from tools.harness.charts import (
    GPU_OPERATOR,
    KUBE_PROMETHEUS_STACK,
    chart_overrides,
    release_values,
)
from tools.harness.processes import descendants, process_table
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack, StackError

from .conftest import apply_stack, require_e2e_tools

STACK = "local"
SCHEDULER_CONFIG_KEY = "config.yaml"


@pytest.fixture(scope="module", name="applied")
def applied_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppliedStack]:
    yield from apply_stack(STACK, tmp_path_factory.mktemp("e2e-engine"))


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _urns(applied: AppliedStack, type_: str, parent_type: str | None = None) -> list[str]:
    """URNs in the stack's state of resources whose type starts with `type_` (under a
    component of `parent_type`)."""
    state = {r["urn"]: r for r in applied.engine.resources()}
    return [
        urn
        for urn, r in state.items()
        if r["type"].startswith(type_)
        and (parent_type is None or state.get(r.get("parent", ""), {}).get("type") == parent_type)
    ]


def _resources_only(changes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`changes` without provider instances: the dynamic providers' default provider holds the
    stack config, so any config change updates it, which changes no resource."""
    return [(op, urn) for op, urn in changes if "::pulumi:providers:" not in urn]


def _scheduler_config_map(applied: AppliedStack) -> Any:
    name = applied.outputs["schedulerName"]
    namespace = (stack_config(STACK).get("scheduler") or {}).get("namespace") or "kube-system"
    return _core(applied).read_namespaced_config_map(name, namespace)


def test_a_new_pool_label_value_updates_the_pool_and_nothing_else(applied: AppliedStack) -> None:
    """`pulumi preview --diff` of a changed label value names one update: the pool's node set;
    `up` makes it and the nodes carry the new value."""
    (pool_set,) = _urns(applied, "pulumi-python:dynamic", "gpu-cluster:index:TaintedGpuPool")
    pool = dict(stack_config(STACK)["gpuPool"])
    labels = {**pool["labels"], "gpu-cluster.io/environment": "local-next"}
    applied.set_config({"gpuPool": {**pool, "labels": labels}})
    assert _resources_only(applied.preview()) == [("update", pool_set)]
    assert _resources_only(applied.up()) == [("update", pool_set)]
    for name, node in applied.node_state().items():
        if name in applied.gpu_nodes:
            assert node["labels"]["gpu-cluster.io/environment"] == "local-next"
    applied.set_config()
    assert _resources_only(applied.up()) == [("update", pool_set)]


def test_a_key_in_a_misspelt_namespace_is_refused_and_nothing_changes(
    applied: AppliedStack,
) -> None:
    """`gpu-clustr:gpuPool` in the stack file: `pulumi up` stops before anything is declared,
    naming the key, and the pool stays tainted (ignored, the pool would fall back to its
    default and be untainted)."""
    nodes = applied.node_state()
    document_key = "gpu-clustr:gpuPool"
    path = applied.engine.project_dir / f"Pulumi.{applied.name}.yaml"
    document = yaml.safe_load(path.read_text())
    document["config"][document_key] = document["config"].pop("gpu-cluster:gpuPool")
    path.write_text(yaml.safe_dump(document))
    try:
        with pytest.raises(StackError) as refused:
            applied.up()
        assert "gpu-clustr:gpuPool: unknown config namespace 'gpu-clustr'" in str(refused.value)
        assert applied.node_state() == nodes
    finally:
        applied.set_config()
    assert _resources_only(applied.up()) == []


def test_a_hand_edit_of_the_scheduler_config_shows_in_refresh_and_up_puts_it_back(
    applied: AppliedStack,
) -> None:
    """Drift: `kubectl edit` of the scheduler's ConfigMap is seen by `preview --refresh` as an
    update of that ConfigMap alone, and the next `pulumi up --refresh` restores the config."""
    config_map = _scheduler_config_map(applied)
    rendered = config_map.data[SCHEDULER_CONFIG_KEY]
    edited = yaml.safe_load(rendered)
    edited["percentageOfNodesToScore"] = 7
    _core(applied).patch_namespaced_config_map(
        config_map.metadata.name,
        config_map.metadata.namespace,
        {"data": {SCHEDULER_CONFIG_KEY: yaml.safe_dump(edited)}},
        field_manager="kubectl-edit",
    )
    (urn,) = [u for u in _urns(applied, "kubernetes:core/v1:ConfigMap") if "scheduler" in u]
    assert _resources_only(applied.preview(refresh=True)) == [("update", urn)]
    assert _resources_only(applied.up(refresh=True)) == [("update", urn)]
    assert _scheduler_config_map(applied).data[SCHEDULER_CONFIG_KEY] == rendered
    assert applied.up() == []


def test_a_renamed_scheduler_is_replaced_and_serves_under_its_new_name(
    applied: AppliedStack, namespace: str
) -> None:
    """scheduler.name names its ConfigMap, ServiceAccount, Deployment and their selector:
    a new name replaces those objects (created before the old ones are deleted), the gate
    routes GPU pods to the new name, and the old objects are gone."""
    old = applied.outputs["schedulerName"]
    new = f"{old}-next"
    section = dict(stack_config(STACK).get("scheduler") or {})
    applied.set_config({"scheduler": {**section, "name": new}})
    planned = applied.preview()
    replaced = {urn.rpartition("::")[2] for op, urn in planned if op == "replace"}
    assert any("scheduler" in r for r in replaced), planned
    assert not [(op, urn) for op, urn in planned if op == "delete"], planned
    old_objects = [o for o in applied.kubernetes_objects() if o["name"] == old]
    applied.up()
    assert applied.outputs["schedulerName"] == new
    assert [o for o in old_objects if applied.exists(o)] == []
    core = _core(applied)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "routed"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-job:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    created = core.create_namespaced_pod(namespace, pod)
    assert created.spec.scheduler_name == new
    deadline = time.monotonic() + 60
    while core.read_namespaced_pod("routed", namespace).status.phase != "Running":
        assert time.monotonic() < deadline, "the routed pod was not bound by the new scheduler"
        time.sleep(0.5)
    applied.set_config()
    applied.up()
    assert applied.outputs["schedulerName"] == old


def test_a_chart_version_bump_upgrades_each_release_with_its_crd_switches(
    applied: AppliedStack,
) -> None:
    """New chart versions: the kubernetes provider upgrades both releases in place (no
    replacement), each renders its values again, with the CRD-upgrade switches as configured
    (the GPU Operator's pre-upgrade CRD Job, kube-prometheus-stack's CRD Job)."""
    core = _core(applied)
    config = stack_config(STACK, applied.overrides)
    bumped = {GPU_OPERATOR: "v26.4.0", KUBE_PROMETHEUS_STACK: "88.3.0"}
    applied.set_config(chart_overrides(applied.charts_dir, config, bumped))
    releases = _urns(applied, HELM_RELEASE)
    assert sorted(_resources_only(applied.up())) == sorted(("update", u) for u in releases)
    assert applied.outputs["gpuOperatorChart"] == "v26.4.0"
    namespace = applied.outputs["gpuOperatorNamespace"]
    operator = release_values(core, namespace, "gpu-operator")
    assert operator["operator"]["upgradeCRD"] is True
    rendered = core.read_namespaced_config_map("gpu-operator-values", namespace)
    assert rendered.metadata.labels["helm.sh/chart"] == "gpu-operator-v26.4.0"
    monitoring = release_values(core, "monitoring", "kube-prometheus-stack")
    assert monitoring["crds"] == {"enabled": True, "upgradeJob": {"enabled": True}}
    rendered = core.read_namespaced_config_map("kube-prometheus-stack-values", "monitoring")
    assert rendered.metadata.labels["helm.sh/chart"] == "kube-prometheus-stack-88.3.0"
    applied.set_config()
    applied.up()
    assert applied.outputs["gpuOperatorChart"] == gpu_operator_settings.DEFAULT_VERSION


def test_destroy_then_up_from_empty_state_on_the_same_cluster(applied: AppliedStack) -> None:
    """Nothing `destroy` leaves behind (the charts' CRDs, which Helm keeps) blocks a new `up`
    from empty state; its second `up` changes nothing; destroy leaves the nodes as before."""
    applied.destroy()
    assert applied.node_state() == applied.nodes_before
    created = applied.up()
    assert created and {op for op, _ in created} == {"create"}
    assert all(applied.exists(o) for o in applied.kubernetes_objects())
    assert applied.up() == []
    applied.destroy()
    assert applied.node_state() == applied.nodes_before


# ------------------------------------------------------------------ interrupted runs


def _cli_pid() -> int | None:
    """The `pulumi up` process this test process started, if it runs."""
    for process in process_table().values():
        argv = process.argv
        if process.ppid == os.getpid() and argv and argv[0].endswith("pulumi") and "up" in argv:
            return process.pid
    return None


def _interrupt_mid_run(applied: AppliedStack, signum: int, after: int = 12) -> None:
    """Start `pulumi up`, send `signum` to the CLI once `after` resources have started; the
    run fails."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            applied.up()
        except BaseException as exc:  # the run is expected to fail
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while len(applied.engine.steps) < after:
        assert thread.is_alive(), f"up ended before it could be interrupted: {failure}"
        assert time.monotonic() < deadline, "up did not get going"
        time.sleep(0.05)
    pid = _cli_pid()
    assert pid is not None, "no pulumi CLI process found"
    # A killed CLI takes its plugins with it, as when a CI runner goes away (else they would be
    # left running here, orphaned); Ctrl-C is the CLI's own to handle.
    plugins = descendants(pid) if signum == signal.SIGKILL else []
    os.kill(pid, signum)
    for child in plugins:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert failure and isinstance(failure[0], StackError), failure


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_an_interrupted_up_is_finished_by_the_next_up(
    signum: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Ctrl-C, or the CLI killed outright, in the middle of the first `up`: what the README
    says to run then (docs: "An interrupted up") leaves nothing pending, and the stack ends
    exactly as an uninterrupted `up` leaves it; a further `up` changes nothing."""
    require_e2e_tools()
    workdir = tmp_path_factory.mktemp(f"e2e-{signal.Signals(signum).name.lower()}")
    with AppliedStack(STACK, workdir) as applied:
        _interrupt_mid_run(applied, signum)
        applied.recover()
        applied.up()
        assert not applied.engine.deployment().get("pending_operations")
        assert applied.up() == []
        assert all(applied.exists(o) for o in applied.kubernetes_objects())
        tainted = applied.node_state()
        taint = applied.outputs["gpuTaint"]
        for name in applied.gpu_nodes:
            assert (taint["key"], taint["value"], taint["effect"]) in tainted[name]["taints"]
        applied.destroy()
        assert applied.node_state() == applied.nodes_before


# ------------------------------------------------------------------ two stacks, one cluster


def test_two_stacks_on_one_cluster_never_undo_each_other(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A second stack of the same shape on a cluster the first manages: its `up` is refused
    before it takes over anything of the first, and its `destroy` removes nothing of the
    first; the first stack then changes nothing on `up --refresh` and its pods still run."""
    require_e2e_tools()
    first_dir = tmp_path_factory.mktemp("e2e-first")
    with AppliedStack(STACK, first_dir) as first:
        first.up()
        objects = first.kubernetes_objects()
        nodes = first.node_state()
        second = AppliedStack(
            STACK, tmp_path_factory.mktemp("e2e-second"), cluster=first.cluster, name="second"
        )
        with second:
            with pytest.raises(StackError) as refused:
                second.up()
            # Refused on the claim, naming it, before any object of the first was touched.
            assert f".data.{CLAIM_KEY}" in str(refused.value)
            assert second.kubernetes_objects() == []
            second.destroy()
        assert all(first.exists(o) for o in objects)
        assert first.node_state() == nodes
        assert first.up(refresh=True) == []
        first.destroy()
        assert first.node_state() == first.nodes_before
