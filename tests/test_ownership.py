"""The ownership check (components/ownership.py): its rules as tables, and the whole program
under Pulumi mocks against an in-memory cluster (tests/fake_cluster.py). The same check against
a real API server under the real engine: tests/e2e/test_shared_cluster.py (there too: an
object someone else makes after a failed `up` is refused, not taken over)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from components.gpu_operator.manifests import operator_namespace_needs
from components.gpu_operator.settings import DRA_ADMIN_NAMESPACE_LABEL
from components.gpu_resources import Allocation
from components.monitoring_stack.manifests import monitoring_namespace_needs
from components.object_meta import PART_OF, NamespaceLabel, namespace_labels
from components.ownership import (
    HELM_RELEASE_API,
    HELM_RELEASE_KIND,
    PATCH_FORCE,
    STACK_MARK,
    ClusterReader,
    Declared,
    LiveClaim,
    LiveObject,
    ObjectRef,
    OwnershipError,
    UsedNamespace,
    applied_here,
    claim_problems,
    namespace_problems,
    object_problems,
    objects_record,
    parse_objects_record,
    vouched_uids,
)
from tests.conftest import Recording, run_program
from tests.fake_cluster import (
    MOCK_STACK_ID,
    FakeCluster,
    claim_object,
    claimed_cluster,
    helm_release_objects,
    namespace_object,
)
from tools.harness.pulumi_engine import project_config

NAMESPACE = ObjectRef("v1", "Namespace", "", "monitoring")
CONFIG_MAP = ObjectRef("v1", "ConfigMap", "kube-system", "gpu-binpack-scheduler")
# How the CLI tells the program which config values were stored with --secret.
SECRET_KEYS = '["gpu-cluster:grafanaAdminPassword"]'
DECLARED = [Declared(NAMESPACE, "monitoring.namespace"), Declared(CONFIG_MAP, "scheduler")]


def _claim(
    stack_id: str = "ours", objects: Mapping[ObjectRef, str | None] | None = None
) -> LiveClaim:
    """A claim of `stack_id` listing `objects` ({ref: the UID it vouches for, "" for none,
    None for a record of the previous release})."""
    return LiveClaim(stack_id=stack_id, stack_label="org/gpu-cluster/dev", objects=objects)


def _live(
    ref: ObjectRef,
    *,
    part_of: bool = False,
    forced: bool = False,
    stack: str | None = None,
    uid: str = "",
) -> LiveObject:
    return LiveObject(ref=ref, part_of=part_of, forced=forced, stack=stack, uid=uid)


def _keys(problems: list[object]) -> list[str]:
    return [str(p).split(":")[1] for p in problems]


def test_ownership_record_round_trips_and_ignores_what_it_cannot_read() -> None:
    record = objects_record([CONFIG_MAP, NAMESPACE, CONFIG_MAP], {CONFIG_MAP: "uid-1"})
    assert parse_objects_record(record) == {CONFIG_MAP: "uid-1", NAMESPACE: ""}
    assert record.count("\n") == 3  # one object a line, between the brackets
    assert parse_objects_record(None) is None
    assert parse_objects_record("not json") is None
    assert parse_objects_record('[{"kind": "ConfigMap"}]') == {}


def test_ownership_a_record_of_the_previous_release_is_told_from_one_that_vouches_for_none() -> (
    None
):
    """The previous release wrote no UID field: its records parse to None, not to ""."""
    legacy = '[{"apiVersion": "v1", "kind": "Namespace", "name": "monitoring", "namespace": ""}]'
    assert parse_objects_record(legacy) == {NAMESPACE: None}
    assert parse_objects_record(objects_record([NAMESPACE])) == {NAMESPACE: ""}


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
    ("claim", "stack_id", "retake", "live", "refused"),
    [
        # Absent objects are never refused.
        (None, None, False, [], []),
        # Nobody's claim: every existing object is someone else's.
        (None, None, False, [_live(NAMESPACE)], ["monitoring.namespace"]),
        # Listed by this stack's claim and carrying its mark: its own; listed but unmarked, and
        # the claim vouching for no UID (an earlier `up` declared it and did not create it):
        # someone else's.
        (
            _claim("ours", {CONFIG_MAP: "", NAMESPACE: ""}),
            "ours",
            False,
            [_live(CONFIG_MAP, stack="ours"), _live(NAMESPACE, part_of=True)],
            ["monitoring.namespace"],
        ),
        # Marked, but not listed: the claim decides what the stack manages.
        (
            _claim("ours", {CONFIG_MAP: ""}),
            "ours",
            False,
            [_live(CONFIG_MAP, stack="ours"), _live(NAMESPACE, stack="ours")],
            ["monitoring.namespace"],
        ),
        # Unmarked, the very object whose UID the claim vouches for: its own; another of the
        # same name (the stack's deleted, this one made since): someone else's.
        (
            _claim("ours", {CONFIG_MAP: "uid-1", NAMESPACE: "uid-2"}),
            "ours",
            False,
            [_live(CONFIG_MAP, uid="uid-1"), _live(NAMESPACE, part_of=True, uid="uid-3")],
            ["monitoring.namespace"],
        ),
        # Records of the previous release (no UID field): listed and labelled part of the
        # project, or applied with patchForce as every object of the stack is, is its own;
        # listed with neither is not.
        (
            _claim("ours", {CONFIG_MAP: None, NAMESPACE: None}),
            "ours",
            False,
            [_live(CONFIG_MAP, part_of=True), _live(NAMESPACE)],
            ["monitoring.namespace"],
        ),
        (
            _claim("ours", {CONFIG_MAP: None, NAMESPACE: None}),
            "ours",
            False,
            [_live(CONFIG_MAP, forced=True), _live(NAMESPACE, part_of=True, forced=True)],
            [],
        ),
        # Marked by another stack: never this one's, listed and labelled or not.
        (
            _claim("ours", {CONFIG_MAP: None, NAMESPACE: ""}),
            "ours",
            False,
            [_live(CONFIG_MAP, part_of=True, stack="theirs"), _live(NAMESPACE, stack="theirs")],
            ["scheduler", "monitoring.namespace"],
        ),
        # A claim written before it listed objects: the mark, or the project's label, decides.
        (
            _claim("ours"),
            "ours",
            False,
            [_live(CONFIG_MAP, part_of=True), _live(NAMESPACE)],
            ["monitoring.namespace"],
        ),
        # Another stack's claim: nothing is this stack's, even listed, labelled and marked.
        (
            _claim("theirs", {CONFIG_MAP: ""}),
            "ours",
            False,
            [_live(CONFIG_MAP, part_of=True, stack="ours")],
            ["scheduler"],
        ),
        # The claim taken back: marked by this stack or labelled (an earlier release's).
        (
            None,
            "ours",
            True,
            [_live(CONFIG_MAP, stack="ours"), _live(NAMESPACE, part_of=True)],
            [],
        ),
        (
            None,
            "ours",
            True,
            [_live(CONFIG_MAP, part_of=True, stack="theirs"), _live(NAMESPACE)],
            ["scheduler", "monitoring.namespace"],
        ),
    ],
    ids=[
        "absent",
        "no-claim",
        "listed-marked-or-not",
        "marked-unlisted",
        "vouched-uid",
        "previous-release-records",
        "previous-release-forced",
        "another-stacks-mark",
        "unlisted-claim",
        "other-stack",
        "retaken",
        "retaken-not-ours",
    ],
)
def test_ownership_object_rules(
    claim: LiveClaim | None,
    stack_id: str | None,
    retake: bool,
    live: list[LiveObject],
    refused: list[str],
) -> None:
    problems = object_problems(DECLARED, live, claim, stack_id, retake=retake)
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
    labels = namespace_labels(monitoring_namespace_needs())
    cluster = FakeCluster(
        [claim_object("another-stacks-id"), namespace_object("monitoring", labels)]
    )
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


# ------------------------------------------------------------------ what the stack created

RELEASE = ObjectRef(HELM_RELEASE_API, HELM_RELEASE_KIND, "ops", "gpu-operator")
LOCAL_SECRETS = {"grafanaAdminPassword": "pw"}
# The local stack's namespaces and releases, as its config names them.
LOCAL = project_config("local")
MONITORING_NS = str(LOCAL["monitoring"].get("namespace") or "monitoring")
OPERATOR_NS = str(LOCAL["gpuOperator"].get("namespace") or "gpu-operator")
MONITORING_REF = ObjectRef("v1", "Namespace", "", MONITORING_NS)


def _local_program(cluster: FakeCluster) -> Recording:
    return run_program("local", LOCAL_SECRETS, cluster=cluster)


def _declared_by_local() -> list[ObjectRef]:
    """Every object the local stack declares (what its claim lists)."""
    recording = _local_program(FakeCluster())
    (claim,) = [r for r in recording.resources if r.name == "cluster-claim"]
    listed = parse_objects_record(claim.inputs["data"]["objects"])
    assert listed
    return sorted(listed)


def _written_claim(recording: Recording) -> dict[ObjectRef, str | None]:
    (claim,) = [r for r in recording.resources if r.name == "cluster-claim"]
    listed = parse_objects_record(claim.inputs["data"]["objects"])
    assert listed is not None
    return listed


def _previous_release_record(refs: list[ObjectRef]) -> str:
    """The claim's list as the previous release wrote it: no UID field."""
    return json.dumps([ref.record() for ref in refs])


@pytest.fixture(name="local_secrets")
def local_secrets_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", SECRET_KEYS)


@pytest.mark.usefixtures("local_secrets")
def test_ownership_every_object_and_release_carries_the_stacks_mark() -> None:
    """What proves an object the stack's is written with it: the stack's id in the STACK_MARK
    annotation of every Kubernetes object, and among the values of every Helm release."""
    recording = _local_program(claimed_cluster())
    objects = [
        r
        for r in recording.resources
        if r.typ.startswith("kubernetes:") and r.name != "cluster-claim"
    ]
    releases = [r for r in objects if r.typ == "kubernetes:helm.sh/v3:Release"]
    assert len(releases) == 2
    for release in releases:
        assert release.inputs["values"][STACK_MARK] == MOCK_STACK_ID, release.name
    for obj in objects:
        if obj not in releases:
            annotations = obj.inputs["metadata"].get("annotations") or {}
            assert annotations.get(STACK_MARK) == MOCK_STACK_ID, obj.name
    (claim,) = [r for r in recording.resources if r.name == "cluster-claim"]
    assert STACK_MARK not in (claim.inputs["metadata"].get("annotations") or {})


@pytest.mark.usefixtures("local_secrets")
def test_ownership_an_object_made_by_someone_else_after_a_failed_up_is_refused() -> None:
    """A failed `up` wrote the claim (every declared object, none created): the `monitoring`
    namespace that another team made since is listed, yet the stack's next `up` refuses it,
    saying why it is listed, instead of taking it over."""
    refs = _declared_by_local()
    cluster = FakeCluster(
        [claim_object(objects=objects_record(refs)), namespace_object(MONITORING_NS)]
    )
    with pytest.raises(OwnershipError) as refused:
        _local_program(cluster)
    (problem,) = refused.value.problems
    assert problem.key == "monitoring.namespace"
    assert "already exists and this stack did not create it" in problem.allowed
    assert "an earlier `up` declared it, but that `up` did not create it" in problem.allowed


@pytest.mark.usefixtures("local_secrets")
def test_ownership_what_a_failed_up_created_is_the_stacks_on_the_next_up() -> None:
    """The same claim, and the namespace that failed `up` did create (it carries the stack's
    mark): the next `up` goes on, and the claim stays as it was (nothing to vouch for)."""
    refs = _declared_by_local()
    record = objects_record(refs)
    marked = namespace_object(
        MONITORING_NS, PART_OF, annotations={STACK_MARK: MOCK_STACK_ID}, uid="uid-m"
    )
    recording = _local_program(FakeCluster([claim_object(objects=record), marked]))
    (claim,) = [r for r in recording.resources if r.name == "cluster-claim"]
    assert claim.inputs["data"]["objects"] == record


@pytest.mark.usefixtures("local_secrets")
@pytest.mark.parametrize(
    ("labels", "annotations"),
    [(PART_OF, {}), ({}, {PATCH_FORCE: "true"})],
    ids=["labelled", "forced"],
)
def test_ownership_a_claim_of_the_previous_release_vouches_for_what_that_release_applied(
    labels: Mapping[str, str], annotations: Mapping[str, str]
) -> None:
    """Migration: a claim the previous release wrote (no UID field) lists the namespace, which
    carries no mark (that release did not mark) but what that release put on every object it
    applied (patchForce; on most the part-of label): the stack's. The claim now written vouches
    for its UID, so an `up` cut off before marking it still knows it, and the next claim is the
    same; with neither (made by someone else after a failed `up` of that release), refused."""
    refs = _declared_by_local()
    claim = claim_object(objects=_previous_release_record(refs))
    applied = namespace_object(MONITORING_NS, labels, annotations=annotations, uid="uid-m")
    recording = _local_program(FakeCluster([claim, applied]))
    written = _written_claim(recording)
    assert written[MONITORING_REF] == "uid-m"
    assert {uid for ref, uid in written.items() if ref != MONITORING_REF} == {""}

    vouched = claim_object(objects=objects_record(refs, {MONITORING_REF: "uid-m"}))
    again = _local_program(FakeCluster([vouched, applied]))
    assert _written_claim(again) == written

    with pytest.raises(OwnershipError) as refused:
        _local_program(FakeCluster([claim, namespace_object(MONITORING_NS, uid="uid-x")]))
    assert [p.key for p in refused.value.problems] == ["monitoring.namespace"]


def test_ownership_an_object_another_stack_applied_is_named_so() -> None:
    (problem,) = object_problems(
        [Declared(CONFIG_MAP, "scheduler")],
        [_live(CONFIG_MAP, part_of=True, forced=True, stack="theirs")],
        _claim("ours", {CONFIG_MAP: None}),
        "ours",
        retake=False,
    )
    assert (
        "ConfigMap kube-system/gpu-binpack-scheduler already exists and this stack did not "
        f"create it (another stack applied it: its {STACK_MARK} annotation names that stack)"
    ) in problem.allowed
    assert "theirs" not in str(problem)


@pytest.mark.parametrize(
    ("live", "applied"),
    [
        ([], False),
        # A Helm release of the stack's release name, without the mark: anyone's.
        ([_live(RELEASE)], False),
        ([_live(RELEASE, stack="ours")], True),
        ([_live(CONFIG_MAP, stack="ours")], True),
        # Another stack's objects say nothing of this one, labelled or not.
        ([_live(CONFIG_MAP, part_of=True, stack="theirs")], False),
        # An earlier release's (unmarked) labelled or forced object: this project applied it.
        ([_live(CONFIG_MAP, part_of=True)], True),
        ([_live(CONFIG_MAP, forced=True)], True),
    ],
    ids=["none", "unmarked-release", "marked-release", "marked", "theirs", "labelled", "forced"],
)
def test_ownership_what_says_this_stack_applied_its_program_here(
    live: list[LiveObject], applied: bool
) -> None:
    assert applied_here(live, "ours") == applied


def test_ownership_the_claim_vouches_for_unmarked_objects_and_keeps_a_uid_still_right() -> None:
    claim = _claim("ours", {CONFIG_MAP: None, NAMESPACE: "uid-2", RELEASE: ""})
    live = [
        _live(CONFIG_MAP, part_of=True, uid="uid-1"),  # unmarked, the previous release's
        _live(NAMESPACE, stack="ours", uid="uid-2"),  # marked since: its UID kept
        _live(RELEASE, stack="ours", uid="2026-01-02T03:04:05Z"),  # marked: none needed
    ]
    assert vouched_uids(live, claim, "ours", retake=False) == {
        CONFIG_MAP: "uid-1",
        NAMESPACE: "uid-2",
    }
    replaced = [_live(NAMESPACE, stack="ours", uid="uid-3")]  # re-created by the stack
    assert vouched_uids(replaced, claim, "ours", retake=False) == {}


# Helm releases: either storage, the mark in the values.


@pytest.mark.parametrize("storage", ["Secret", "ConfigMap"])
def test_ownership_the_reader_finds_a_release_in_either_helm_storage(storage: str) -> None:
    """HELM_DRIVER=secret (Helm's default) or configmap: one LIST of one item per storage,
    the Secrets first; the release's values carry the mark, its first deployment the UID."""
    values = {"operator": {}, STACK_MARK: "ours"}
    objects = helm_release_objects(
        "gpu-operator", "ops", storage=storage, values=values, revisions=3
    )
    cluster = FakeCluster(objects)
    (found,) = ClusterReader(cluster.get).live_objects([RELEASE])
    assert found == LiveObject(
        ref=RELEASE,
        part_of=False,
        stack="ours",
        uid="2026-01-02T03:04:05.123456789Z",
        stored_as=f"{storage} ops/sh.helm.release.v1.gpu-operator.v1",
    )
    lists = ["/api/v1/namespaces/ops/secrets", "/api/v1/namespaces/ops/configmaps"]
    assert cluster.reads == lists[: 1 if storage == "Secret" else 2]
    assert ClusterReader(FakeCluster().get).live_objects([RELEASE]) == []


@pytest.mark.usefixtures("local_secrets")
@pytest.mark.parametrize("storage", ["Secret", "ConfigMap"])
def test_ownership_a_release_of_the_same_name_is_refused_whatever_helm_stored_it_in(
    storage: str,
) -> None:
    """Someone's kube-prometheus-stack in the namespace the local stack's monitoring would
    use, stored by Helm's secret or configmap driver: refused, naming the release, where Helm
    keeps it and the ways out, on a first `up` as after one that failed before installing it
    (the claim lists it)."""
    release = helm_release_objects("kube-prometheus-stack", MONITORING_NS, storage=storage)
    name = "sh.helm.release.v1.kube-prometheus-stack.v1"
    driver = "HELM_DRIVER=configmap " if storage == "ConfigMap" else ""
    listed = claim_object(objects=objects_record(_declared_by_local()))
    for claim in ([], [listed]):
        with pytest.raises(OwnershipError) as refused:
            _local_program(FakeCluster([*claim, *release]))
        (problem,) = refused.value.problems
        assert (problem.key, problem.value) == (
            "monitoring",
            f"Release {MONITORING_NS}/kube-prometheus-stack",
        )
        assert problem.allowed == (
            f"a Helm release kube-prometheus-stack already exists in namespace {MONITORING_NS}, "
            f"stored as {storage} {MONITORING_NS}/{name}, and this stack did not install it "
            "(taken for the stack's, `up` would upgrade it and `destroy` uninstall it); if "
            f"nobody uses it, uninstall it (`{driver}helm uninstall kube-prometheus-stack -n "
            f"{MONITORING_NS}`), or install the layer into another namespace "
            "(monitoring.namespace), or turn the layer off (monitoring.enabled: false) and "
            "keep that release"
        )


@pytest.mark.usefixtures("local_secrets")
def test_ownership_a_release_of_the_same_name_is_not_taken_for_a_vanished_claim() -> None:
    """A stack that has an id (a first `up` refused before) and no claim on the cluster, where
    someone installed a gpu-operator release: the refusal is about that release, not about a
    claim of this stack's that would be gone (there never was one)."""
    release = helm_release_objects("gpu-operator", OPERATOR_NS)
    with pytest.raises(OwnershipError) as refused:
        _local_program(FakeCluster(release))
    assert [p.key for p in refused.value.problems] == ["gpuOperator"]
    assert "is gone" not in str(refused.value)
    assert "a Helm release gpu-operator already exists" in str(refused.value)


@pytest.mark.usefixtures("local_secrets")
def test_ownership_the_stacks_own_release_is_its_own_in_either_storage() -> None:
    """A release the stack installed (its mark in the values) during an `up` that failed
    later: listed, found in ConfigMaps (the provider run with HELM_DRIVER=configmap), the
    stack's; the same release without the mark is someone else's."""
    refs = _declared_by_local()
    claim = claim_object(objects=objects_record(refs))
    ours = helm_release_objects(
        "gpu-operator", OPERATOR_NS, storage="ConfigMap", values={STACK_MARK: MOCK_STACK_ID}
    )
    _local_program(FakeCluster([claim, *ours]))
    theirs = helm_release_objects("gpu-operator", OPERATOR_NS, storage="ConfigMap")
    with pytest.raises(OwnershipError) as refused:
        _local_program(FakeCluster([claim, *theirs]))
    assert [p.key for p in refused.value.problems] == ["gpuOperator"]
