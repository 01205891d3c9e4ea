"""The ownership check (components/ownership.py): its rules as tables, and the whole program
under Pulumi mocks against an in-memory cluster (tests/fake_cluster.py). The same check against
a real API server under the real engine: tests/e2e/test_shared_cluster.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from components.gpu_operator.manifests import operator_namespace_needs
from components.gpu_operator.settings import DRA_ADMIN_NAMESPACE_LABEL, Allocation
from components.object_meta import PART_OF, NamespaceLabel
from components.ownership import (
    ClusterReader,
    Declared,
    LiveClaim,
    LiveObject,
    ObjectRef,
    OwnershipError,
    UsedNamespace,
    claim_problems,
    namespace_problems,
    object_problems,
    objects_record,
    parse_objects_record,
)
from tests.conftest import run_program
from tests.fake_cluster import (
    MOCK_STACK_ID,
    FakeCluster,
    claim_object,
    claimed_cluster,
    namespace_object,
)
from tools.harness.pulumi_engine import project_config

NAMESPACE = ObjectRef("v1", "Namespace", "", "monitoring")
CONFIG_MAP = ObjectRef("v1", "ConfigMap", "kube-system", "gpu-binpack-scheduler")
# How the CLI tells the program which config values were stored with --secret.
SECRET_KEYS = '["gpu-cluster:grafanaAdminPassword"]'
DECLARED = [Declared(NAMESPACE, "monitoring.namespace"), Declared(CONFIG_MAP, "scheduler")]


def _claim(stack_id: str = "ours", objects: frozenset[ObjectRef] | None = None) -> LiveClaim:
    return LiveClaim(stack_id=stack_id, stack_label="org/gpu-cluster/dev", objects=objects)


def _keys(problems: list[object]) -> list[str]:
    return [str(p).split(":")[1] for p in problems]


def test_ownership_record_round_trips_and_ignores_what_it_cannot_read() -> None:
    record = objects_record([CONFIG_MAP, NAMESPACE, CONFIG_MAP])
    assert parse_objects_record(record) == frozenset({CONFIG_MAP, NAMESPACE})
    assert record.count("\n") == 3  # one object a line, between the brackets
    assert parse_objects_record(None) is None
    assert parse_objects_record("not json") is None
    assert parse_objects_record('[{"kind": "ConfigMap"}]') == frozenset()


@pytest.mark.parametrize(
    ("claim", "stack_id", "retake", "applied", "refused"),
    [
        (None, None, False, False, False),  # a new stack on a new cluster
        (None, "ours", False, False, False),  # a first `up` that was refused before applying
        (_claim("ours"), "ours", False, True, False),
        (_claim("theirs"), "ours", False, True, True),  # another stack's cluster
        (_claim("theirs"), None, False, True, True),  # a new stack on another stack's cluster
        (None, "ours", False, True, True),  # this stack's claim was deleted
        (None, "ours", True, True, False),  # ... and is taken back on purpose
    ],
    ids=["first-up", "refused-first-up", "ours", "theirs", "new-on-theirs", "gone", "retaken"],
)
def test_ownership_claim_rules(
    claim: LiveClaim | None, stack_id: str | None, retake: bool, applied: bool, refused: bool
) -> None:
    problems = claim_problems(
        claim, stack_id, "org/gpu-cluster/dev", retake=retake, where="x/y", applied=applied
    )
    assert bool(problems) == refused
    if refused:
        assert problems[0].key == "claim"


@pytest.mark.parametrize(
    ("claim", "stack_id", "live", "refused"),
    [
        # Absent objects are never refused.
        (None, None, [], []),
        # Nobody's claim: every existing object is someone else's.
        (None, None, [LiveObject(ref=NAMESPACE, part_of=False)], ["monitoring.namespace"]),
        # This stack's claim lists what it manages: listed is ours, unlisted is not.
        (
            _claim("ours", frozenset({CONFIG_MAP})),
            "ours",
            [LiveObject(ref=CONFIG_MAP, part_of=True), LiveObject(ref=NAMESPACE, part_of=True)],
            ["monitoring.namespace"],
        ),
        # A claim written before it listed objects: the project's label decides.
        (
            _claim("ours"),
            "ours",
            [LiveObject(ref=CONFIG_MAP, part_of=True), LiveObject(ref=NAMESPACE, part_of=False)],
            ["monitoring.namespace"],
        ),
        # Another stack's claim: nothing is this stack's, even listed and labelled.
        (
            _claim("theirs", frozenset({CONFIG_MAP})),
            "ours",
            [LiveObject(ref=CONFIG_MAP, part_of=True)],
            ["scheduler"],
        ),
    ],
    ids=["absent", "no-claim", "listed", "unlisted-claim", "other-stack"],
)
def test_ownership_object_rules(
    claim: LiveClaim | None, stack_id: str | None, live: list[LiveObject], refused: list[str]
) -> None:
    problems = object_problems(DECLARED, live, claim, stack_id, retake=False)
    assert [p.key for p in problems] == refused


def test_ownership_a_foreign_namespace_names_the_key_the_value_and_the_ways_out() -> None:
    (problem,) = object_problems(
        DECLARED, [LiveObject(ref=NAMESPACE, part_of=False)], None, None, retake=False
    )
    assert str(problem) == (
        "gpu-cluster:monitoring.namespace: got 'monitoring'; Namespace monitoring already exists "
        "and this stack did not create it (`up` would take it over and `destroy` would delete "
        "it); let the layer create a namespace of its own (another monitoring.namespace), or set "
        "monitoring.createNamespace: false to use this one without owning it (destroy then "
        "leaves it)"
    )


def test_ownership_the_whole_program_is_refused_on_another_teams_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under mocks: the local stack creates `monitoring`; the cluster has one already."""
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", SECRET_KEYS)
    cluster = claimed_cluster("monitoring")
    with pytest.raises(OwnershipError) as refused:
        run_program("local", {"grafanaAdminPassword": "pw"}, cluster=cluster)
    assert [p.key for p in refused.value.problems] == ["monitoring.namespace"]


def test_ownership_the_whole_program_declares_and_records_every_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every Kubernetes object and Helm release the program declares is read on the cluster,
    and the claim records exactly those."""
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", SECRET_KEYS)
    cluster = claimed_cluster()
    recording = run_program("local", {"grafanaAdminPassword": "pw"}, cluster=cluster)
    (claim,) = [r for r in recording.resources if r.name == "cluster-claim"]
    recorded = parse_objects_record(claim.inputs["data"]["objects"])
    assert recorded is not None
    declared = {
        (r.inputs.get("kind") or "Release", (r.inputs.get("metadata") or r.inputs)["name"])
        for r in recording.resources
        if r.typ.startswith("kubernetes:") and r.name != "cluster-claim"
    }
    assert {(ref.kind, ref.name) for ref in recorded} == declared
    assert {"Namespace", "Deployment", "Release"} <= {ref.kind for ref in recorded}


def test_ownership_another_stacks_claim_stops_the_program() -> None:
    cluster = FakeCluster([claim_object("another-stacks-id"), namespace_object("monitoring")])
    with pytest.raises(OwnershipError) as refused:
        run_program("dev", cluster=cluster)
    assert [p.key for p in refused.value.problems] == ["claim"]
    assert MOCK_STACK_ID not in str(refused.value)


def test_ownership_an_unreachable_cluster_stops_up_and_names_no_secret() -> None:
    with pytest.raises(OwnershipError) as refused:
        run_program("dev", cluster=FakeCluster(unreachable=True))
    assert [p.key for p in refused.value.problems] == ["kubeconfig"]
    assert "connection refused" in str(refused.value)


def test_ownership_a_namespace_without_settings_is_named_by_its_layer() -> None:
    """The gate's namespace is no setting: the refusal names the layer and no key it lacks."""
    gate = ObjectRef("v1", "Namespace", "", "gpu-admission")
    (problem,) = object_problems(
        [Declared(gate, "admission")],
        [LiveObject(ref=gate, part_of=False)],
        None,
        None,
        retake=False,
    )
    assert str(problem).startswith(
        "gpu-cluster:admission: got 'Namespace gpu-admission'; Namespace gpu-admission already "
        "exists and this stack did not create it"
    )
    assert "createNamespace" not in str(problem)


def _failures_of_a_dev_run() -> list[BaseException]:
    """What a run of the dev program ends with (in a thread of its own, with its own event
    loop); fails the test when the run is still waiting after 60 s."""
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        try:
            run_program("dev")
        except BaseException as exc:  # what the run ends with
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the run still waits for the verdict"
    return failure


def test_ownership_a_check_that_breaks_fails_the_run_instead_of_holding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Everything waits for the verdict: an error inside the check reaches the program (which
    then fails, naming it) rather than leaving the verdict unanswered and the run waiting."""
    from components import ownership

    def broken(*_args: object, **_kwargs: object) -> list[object]:
        raise RuntimeError("the check broke")

    monkeypatch.setattr(ownership, "object_problems", broken)
    assert [str(f) for f in _failures_of_a_dev_run()] == ["the check broke"]


def test_ownership_a_program_that_breaks_before_the_check_fails_the_run_instead_of_holding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim waits for the verdict, which the program's last call gives: a layer that
    raises before that call fails the run, naming the error, instead of leaving the claim's
    registration waiting and the run with it."""
    import components

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a layer broke")

    monkeypatch.setattr(components, "OpaGate", broken)
    assert [str(f) for f in _failures_of_a_dev_run()] == ["a layer broke"]


# ------------------------------------------------------------------ namespaces used, not created

ENFORCE = "pod-security.kubernetes.io/enforce"
PRIVILEGED = NamespaceLabel(ENFORCE, "privileged", "operands run privileged")
ADMIN = NamespaceLabel(DRA_ADMIN_NAMESPACE_LABEL, "true", "dcgm-exporter's admin claim")
OPS = {"ops": UsedNamespace("gpuOperator.namespace", (PRIVILEGED, ADMIN))}


@pytest.mark.parametrize(
    ("used", "live", "refused"),
    [
        # A namespace with what the layer needs; other labels (not part-of) do not matter.
        (OPS, {"ops": {ENFORCE: "privileged", DRA_ADMIN_NAMESPACE_LABEL: "true", "team": "a"}}, []),
        # Missing: one problem, whatever it would need.
        (OPS, {}, [("ops", None)]),
        # Every label it lacks or has with another value, each its own problem.
        (OPS, {"ops": {}}, [("ops", ENFORCE), ("ops", DRA_ADMIN_NAMESPACE_LABEL)]),
        (
            OPS,
            {"ops": {ENFORCE: "baseline", DRA_ADMIN_NAMESPACE_LABEL: "true"}},
            [("ops", ENFORCE)],
        ),
        (
            OPS,
            {"ops": {ENFORCE: "privileged", DRA_ADMIN_NAMESPACE_LABEL: "false"}},
            [("ops", DRA_ADMIN_NAMESPACE_LABEL)],
        ),
        # A layer that needs nothing: any namespace that exists will do.
        ({"monitoring": UsedNamespace("monitoring.namespace")}, {"monitoring": {}}, []),
        # Several namespaces: every problem at once, by namespace.
        (
            {**OPS, "monitoring": UsedNamespace("monitoring.namespace", (PRIVILEGED,))},
            {"ops": {ENFORCE: "restricted", DRA_ADMIN_NAMESPACE_LABEL: "true"}},
            [("monitoring", None), ("ops", ENFORCE)],
        ),
    ],
    ids=["labelled", "missing", "unlabelled", "other-level", "admin-false", "no-needs", "several"],
)
def test_ownership_namespace_rules(
    used: Mapping[str, UsedNamespace],
    live: Mapping[str, Mapping[str, str]],
    refused: list[tuple[str, str | None]],
) -> None:
    """(namespace, the label it lacks, or None when the namespace itself is missing)."""
    problems = namespace_problems(used, live)
    assert [p.key for p in problems] == [used[p.value].key for p in problems]
    found = [
        (
            p.value,
            p.allowed.split(" must carry ")[1].split("=")[0]
            if " must carry " in p.allowed
            else None,
        )
        for p in problems
    ]
    assert found == refused


def test_ownership_a_namespace_without_a_needed_label_names_the_key_label_value_and_fix() -> None:
    unlabelled, other = (
        namespace_problems(OPS, {"ops": labels})[0]
        for labels in ({DRA_ADMIN_NAMESPACE_LABEL: "true"}, {ENFORCE: "baseline"})
    )
    assert str(unlabelled) == (
        "gpu-cluster:gpuOperator.namespace: got 'ops'; namespace ops has no label "
        f"{ENFORCE}; with gpuOperator.createNamespace: false it must carry {ENFORCE}=privileged "
        f"(operands run privileged): label it (`kubectl label namespace ops {ENFORCE}="
        "privileged`), or set gpuOperator.createNamespace: true to let the layer create it"
    )
    assert f"namespace ops has {ENFORCE}=baseline;" in str(other)
    assert f"`kubectl label namespace ops {ENFORCE}=privileged --overwrite`" in str(other)


def test_ownership_a_missing_namespace_names_its_layers_create_namespace_key() -> None:
    (problem,) = namespace_problems(OPS, {})
    assert str(problem) == (
        "gpu-cluster:gpuOperator.namespace: got 'ops'; no such namespace; with "
        "gpuOperator.createNamespace: false the namespace must exist before `up` (create it, "
        "or set gpuOperator.createNamespace: true to let the layer create it)"
    )


def test_ownership_the_reader_gets_each_used_namespace_once_with_its_labels() -> None:
    cluster = FakeCluster([namespace_object("ops", {ENFORCE: "privileged"})])
    found = ClusterReader(cluster.get).namespaces(["ops", "gone", "ops"])
    assert found == {"ops": {ENFORCE: "privileged"}}
    assert sorted(cluster.reads) == ["/api/v1/namespaces/gone", "/api/v1/namespaces/ops"]


@pytest.mark.parametrize(
    ("allocation", "needed"),
    [
        ("device-plugin", {ENFORCE: "privileged"}),
        ("dra", {ENFORCE: "privileged", DRA_ADMIN_NAMESPACE_LABEL: "true"}),
    ],
)
def test_ownership_the_operator_needs_its_pod_security_level_and_dra_admin_access_not_part_of(
    allocation: Allocation, needed: dict[str, str]
) -> None:
    needs = operator_namespace_needs(allocation)
    assert {n.key: n.value for n in needs} == needed
    assert not PART_OF.keys() & needed.keys()


# The program under mocks: the operator in `ops`, a namespace made beforehand.


def _operator_in(namespace: str, allocation: str = "device-plugin") -> dict[str, Any]:
    """The local stack's config overrides: its GPU Operator in `namespace`, which it uses
    without creating (with allocation dra, the first chart with GPUCluster); no monitoring,
    which needs a password these tests do not set."""
    local = project_config("local")
    operator = {**local["gpuOperator"], "namespace": namespace, "createNamespace": False}
    if allocation == "dra":
        operator.update(allocation="dra", version="v26.7.0")
    return {"gpuOperator": operator, "monitoring": {**local["monitoring"], "enabled": False}}


@pytest.mark.usefixtures("empty_kubeconfig_env")
@pytest.mark.parametrize(
    ("allocation", "labels", "missing"),
    [
        ("device-plugin", {}, [ENFORCE]),
        ("device-plugin", {ENFORCE: "baseline"}, [ENFORCE]),
        ("dra", {}, [ENFORCE, DRA_ADMIN_NAMESPACE_LABEL]),
        ("dra", {ENFORCE: "privileged"}, [DRA_ADMIN_NAMESPACE_LABEL]),
    ],
    ids=["device-plugin-unlabelled", "device-plugin-baseline", "dra-unlabelled", "dra-no-admin"],
)
def test_ownership_the_program_refuses_an_existing_operator_namespace_without_its_labels(
    allocation: str, labels: dict[str, str], missing: list[str]
) -> None:
    cluster = FakeCluster([claim_object(), namespace_object("ops", labels)])
    with pytest.raises(OwnershipError) as refused:
        run_program("local", _operator_in("ops", allocation), cluster=cluster)
    problems = refused.value.problems
    assert [(p.key, p.value) for p in problems] == [("gpuOperator.namespace", "ops")] * len(missing)
    for problem, label in zip(problems, missing, strict=True):
        assert f"must carry {label}=" in problem.allowed
        assert f"`kubectl label namespace ops {label}=" in problem.allowed
        assert "gpuOperator.createNamespace: true" in problem.allowed
    assert "nothing was applied" in str(refused.value)


@pytest.mark.usefixtures("empty_kubeconfig_env")
@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
def test_ownership_the_program_uses_an_existing_operator_namespace_with_its_labels(
    allocation: Allocation,
) -> None:
    needed = {n.key: n.value for n in operator_namespace_needs(allocation)}
    cluster = FakeCluster([claim_object(), namespace_object("ops", {**needed, "team": "ops"})])
    recording = run_program("local", _operator_in("ops", allocation), cluster=cluster)
    assert recording.named("gpu-operator-release").inputs["namespace"] == "ops"
    assert not [
        r
        for r in recording.of_type("kubernetes:core/v1:Namespace")
        if r.inputs["metadata"]["name"] == "ops"
    ]
