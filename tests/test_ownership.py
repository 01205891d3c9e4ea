"""The ownership check (components/ownership.py): its rules as tables, and the whole program
under Pulumi mocks against an in-memory cluster (tests/fake_cluster.py). The same check against
a real API server under the real engine: tests/e2e/test_shared_cluster.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from components.ownership import (
    Declared,
    LiveClaim,
    LiveObject,
    ObjectRef,
    OwnershipError,
    claim_problems,
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
