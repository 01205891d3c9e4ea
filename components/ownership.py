"""What the stack may touch on a shared cluster: its claim, checked live, and the objects it
declares, each either created by this stack or not there yet.

The pinned kubernetes provider applies objects server-side, and a create of an object that
already exists becomes an update: the stack would take over another team's namespace (and
every object in it on `destroy`). So before anything is applied, every `preview` and `up`
reads the cluster:

- **The claim** (ConfigMap kube-system/<project>, components/cluster_access.py) must be this
  stack's (its id), or missing while no object this stack applied is on the cluster (a first
  `up`). A claim that vanished while they are (an admin, a GitOps prune) is refused until the
  stack takes it back explicitly (`retakeClaim`), so two stacks never both think they own the
  cluster.
- **Every object the stack declares** (the Kubernetes objects and the Helm releases) is
  either absent, or this stack's: listed in its claim *and* created by it. The claim is written
  before the objects, so it lists them before they exist; what proves that this stack created
  an object is the object itself: every Kubernetes object carries the stack's id in its
  STACK_MARK annotation, every Helm release in its values (both written with the object, in
  the same request, so an `up` that fails or is killed half-way leaves no object of its own
  unmarked). An object of that name that someone else made after such an `up` carries no mark,
  and is refused like any other. The claim also records, per object, the UID of one it took as
  the stack's without its mark (an object of an earlier release, which did not mark them): that
  object, and no other of the same name, stays the stack's.
- **Every namespace a layer uses without creating it** (`createNamespace: false`) exists and
  carries the labels the layer's pods need there (NamespaceLabel: Pod Security's enforce level,
  DRA admin access), the ones the layer would put on a namespace it creates; its bookkeeping
  labels (part-of) are not asked of a namespace the stack does not own.

A Helm release is found in either of Helm's in-cluster storages (its Secrets, or with
HELM_DRIVER=configmap its ConfigMaps, `sh.helm.release.v1.<name>.v<N>` labelled owner=helm).

Objects declared by the program are collected by the stack transformation at registration
(names and namespaces must be plain strings, so they are known before anything is applied);
`Ownership.seal()`, at the end of the program, reads the cluster once, and the claim, on which
every other resource of the stack waits, is written only once the check passed. The check needs
the stack's id, an Output, so its verdict is a future the claim's inputs wait on; a refusal is an
OwnershipError (a RunError, shown without a stack trace).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from components.object_meta import PART_OF, NamespaceLabel
from components.settings import NOT_SHOWN, PROJECT, Problem

HELM_RELEASE_API = "helm.sh/v3"
HELM_RELEASE_KIND = "Release"
READ_TIMEOUT_S = 10
"""How long one read of the check may take."""
RETAKE_KEY = "retakeClaim"
"""The config key that takes a vanished claim back."""
PATCH_FORCE = "pulumi.com/patchForce"
"""The kubernetes provider's annotation: apply this object with force (take over fields). On
every object the stack applies (components/cluster_access.py), since before the claim listed
objects."""
STACK_MARK = f"{PROJECT}.io/stack-id"
"""The stack's mark: an annotation on every Kubernetes object it applies, a key in the values
of every Helm release it installs; its value is the stack's id."""
UID_KEY = "uid"
"""The key of the claim's records that holds the UID the stack vouches for ("" when none). A
record without it was written by an earlier release, before the claim recorded creation."""
HELM_STORAGES = (("secrets", "Secret"), ("configmaps", "ConfigMap"))
"""Where Helm keeps a release in the cluster (its `secret` and `configmap` storage drivers):
(plural, kind), each an object per revision labelled owner=helm,name=<release>."""


@dataclass(frozen=True, order=True)
class ObjectRef:
    """An object the stack declares: its API version, kind, namespace ("" when cluster-scoped)
    and name. A Helm release is `helm.sh/v3` `Release`."""

    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    @property
    def is_namespace(self) -> bool:
        return (self.api_version, self.kind) == ("v1", "Namespace")

    @property
    def is_helm_release(self) -> bool:
        return (self.api_version, self.kind) == (HELM_RELEASE_API, HELM_RELEASE_KIND)

    def record(self) -> dict[str, str]:
        """How the claim lists it."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }

    @classmethod
    def from_record(cls, record: Any) -> ObjectRef | None:
        if not isinstance(record, Mapping):
            return None
        values = [record.get(k) for k in ("apiVersion", "kind", "namespace", "name")]
        strings = [v for v in values if isinstance(v, str)]
        return cls(*strings) if len(strings) == len(values) else None


@dataclass(frozen=True)
class Declared:
    """An object of the program and the config key a refusal names: the declaring layer's
    section (`scheduler`), or its namespace key (`monitoring.namespace`) for its Namespace."""

    ref: ObjectRef
    key: str


def objects_record(refs: Iterable[ObjectRef], uids: Mapping[ObjectRef, str] | None = None) -> str:
    """The claim's list of what the stack manages: JSON, one object a line, sorted; each with
    the UID the stack vouches for (`uids`, "" for the others: its mark says whose it is)."""
    uids = uids or {}
    lines = [
        json.dumps({**ref.record(), UID_KEY: uids.get(ref, "")}, sort_keys=True)
        for ref in sorted(set(refs))
    ]
    return "[\n" + ",\n".join(lines) + "\n]" if lines else "[]"


def parse_objects_record(text: str | None) -> dict[ObjectRef, str | None] | None:
    """{ref: the UID its record vouches for ("" for none), or None for a record an earlier
    release wrote} of what a claim lists; None when it lists nothing (a claim written before
    the claim recorded its objects)."""
    if text is None:
        return None
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(records, list):
        return None
    listed: dict[ObjectRef, str | None] = {}
    for record in records:
        ref = ObjectRef.from_record(record)
        if ref is not None:
            uid = record.get(UID_KEY)
            listed[ref] = None if UID_KEY not in record else uid if isinstance(uid, str) else ""
    return listed


@dataclass(frozen=True, kw_only=True)
class LiveClaim:
    """The claim as the cluster holds it now."""

    stack_id: str
    stack_label: str
    objects: Mapping[ObjectRef, str | None] | None
    """What it lists as the stack's, each with the UID it vouches for ("" for none; None when
    an earlier release wrote the record); None when it lists nothing."""


@dataclass(frozen=True)
class UsedNamespace:
    """A namespace a layer uses without creating it: the config key that names it
    (`gpuOperator.namespace`), and the labels the layer's pods need on it."""

    key: str
    needs: tuple[NamespaceLabel, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LiveObject:
    """An object that exists: whether it carries the project's part-of label, the stack id its
    mark names, its UID, and where a Helm release was found."""

    ref: ObjectRef
    part_of: bool
    """Labelled part of the project (or the scheduler's Lease held by its pods): what an earlier
    release, which did not mark its objects, left to tell them by. Never a Helm release's."""
    forced: bool = False
    """Carries PATCH_FORCE "true", as every object of every release of the stack that listed
    its objects in the claim (not one made with kubectl or Helm): what tells an unmarked object
    of the previous release as applied by the stack."""
    stack: str | None = None
    """The stack id of its STACK_MARK, None when it carries none."""
    uid: str = ""
    """Its metadata.uid; for a Helm release, which has none, its first deployment's time (kept
    across upgrades, new with each install)."""
    stored_as: str = ""
    """A Helm release's storage object found (`ConfigMap ns/sh.helm.release.v1.x.v1`)."""

    def marked_by(self, stack_id: str | None) -> bool:
        return stack_id is not None and self.stack == stack_id


def applied_here(live: Iterable[LiveObject], stack_id: str | None) -> bool:
    """Whether this stack has applied its program on the cluster: an object of it carries the
    stack's mark, or an unmarked one (left by an earlier release) the project's label or the
    stack's patchForce. A Helm release without the mark tells nothing: anyone may have
    installed one of that name."""
    return any(o.marked_by(stack_id) or (o.stack is None and (o.part_of or o.forced)) for o in live)


# --------------------------------------------------------------------------- the rules


def claim_problems(
    claim: LiveClaim | None,
    stack_id: str | None,
    label: str,
    *,
    retake: bool,
    where: str,
    applied: bool = False,
) -> list[Problem]:
    """Why this stack (`stack_id`, None before its first `up`; `label` org/project/stack) may
    not go on with the claim as the cluster holds it (`where` names the claim). `applied`: an
    object the stack declares is on the cluster and this stack applied it (`applied_here`), so
    a claim missing then was deleted, not never written."""
    if claim is not None and claim.stack_id != stack_id:
        return [
            Problem(
                key="claim",
                value=NOT_SHOWN,
                allowed=f"the cluster is managed by another stack: {where} (.data.managed-by-"
                f"stack) holds stack {claim.stack_label!r}, not this one ({label!r}); one "
                "stack manages a cluster. Run this stack against another cluster, or "
                f"`pulumi destroy` the other stack first",
            )
        ]
    if claim is None and stack_id is not None and applied and not retake:
        return [
            Problem(
                key="claim",
                value=NOT_SHOWN,
                allowed=f"this stack ({label!r}) claimed the cluster, and its claim {where} is "
                "gone (deleted by hand or pruned): another stack may have taken over meanwhile. "
                "Check that no other stack manages the cluster, then take it back once with "
                f"`pulumi up --refresh --config {PROJECT}:{RETAKE_KEY}=true` and remove the "
                f"key again (`pulumi config rm {PROJECT}:{RETAKE_KEY}`)",
            )
        ]
    return []


def _legacy_evidence(live: LiveObject) -> bool:
    """What tells an unmarked object of an earlier release as the project's: its part-of label,
    or the patchForce annotation every object of those releases carries; for a Helm release (no
    metadata of its own), as those releases had it, its name."""
    return live.part_of or live.forced or (live.ref.is_helm_release and live.stack is None)


def _ours(live: LiveObject, claim: LiveClaim | None, stack_id: str | None, retake: bool) -> bool:
    """Whether an existing object is this stack's. One marked by another stack never is. Where
    this stack's claim lists objects: listed, and either marked by this stack, or the very
    object (its UID) the claim vouches for, or, for a record of an earlier release (no UID
    field), with that release's evidence (`_legacy_evidence`). Where the claim lists nothing
    (written by an older release, or being taken back): marked, or with that evidence."""
    if live.stack is not None and not live.marked_by(stack_id):
        return False
    mine = stack_id is not None and claim is not None and claim.stack_id == stack_id
    if mine and claim is not None and claim.objects is not None:
        if live.ref not in claim.objects:
            return False
        uid = claim.objects[live.ref]
        if live.marked_by(stack_id):
            return True
        if uid is None:
            return _legacy_evidence(live)
        return uid != "" and uid == live.uid
    if mine or (claim is None and retake and stack_id is not None):
        return live.marked_by(stack_id) or _legacy_evidence(live)
    return False


def vouched_uids(
    live: Iterable[LiveObject], claim: LiveClaim | None, stack_id: str | None, *, retake: bool
) -> dict[ObjectRef, str]:
    """The UIDs the claim now written vouches for: of each of this stack's objects that carries
    no mark (it came from an earlier release; the `up` marks it), so an `up` interrupted
    before that still knows it; and a UID already recorded while it is still the object's. An
    object that is marked needs none."""
    uids = {}
    for obj in live:
        if not _ours(obj, claim, stack_id, retake):
            continue
        recorded = claim.objects.get(obj.ref) if claim and claim.objects else None
        if not obj.marked_by(stack_id) or recorded == obj.uid:
            uids[obj.ref] = obj.uid
    return uids


def _why_not_ours(live: LiveObject, claim: LiveClaim | None, stack_id: str | None) -> str:
    """Why an object is not the stack's, where more can be said than that: another stack's
    mark, or this stack's claim listing it; "" otherwise."""
    if live.stack is not None and not live.marked_by(stack_id):
        return f" (another stack applied it: its {STACK_MARK} annotation names that stack)"
    if claim is None or claim.stack_id != stack_id or not claim.objects:
        return ""
    uid = claim.objects.get(live.ref, "-")
    if uid is None:
        return (
            " (the claim an earlier release wrote lists it, but it carries neither this "
            f"stack's mark, nor the project's part-of label, nor {PATCH_FORCE}: someone else "
            "made it)"
        )
    if uid == "":
        return (
            " (the claim lists it because an earlier `up` declared it, but that `up` did not "
            "create it: it was made since, by someone else)"
        )
    if uid != "-" and uid != live.uid:
        return (
            " (the one this stack created is gone: this one, made since by someone else, is "
            f"another object, UID {live.uid or 'unknown'})"
        )
    return ""


def _release_problem(declared: Declared, live: LiveObject) -> str:
    """A Helm release of a declared release's name that this stack did not install."""
    ref = declared.ref
    stored = f", stored as {live.stored_as}" if live.stored_as else ""
    driver = "HELM_DRIVER=configmap " if live.stored_as.startswith("ConfigMap") else ""
    section = declared.key.partition(".")[0]
    return (
        f"a Helm release {ref.name} already exists in namespace {ref.namespace}{stored}, and "
        "this stack did not install it (taken for the stack's, `up` would upgrade it and "
        f"`destroy` uninstall it); if nobody uses it, uninstall it (`{driver}helm uninstall "
        f"{ref.name} -n {ref.namespace}`), or install the layer into another namespace "
        f"({section}.namespace), or turn the layer off ({section}.enabled: false) and keep "
        "that release"
    )


def _ways_out(declared: Declared) -> str:
    if declared.ref.is_namespace and declared.key.endswith(".namespace"):
        key = declared.key
        section = key.rpartition(".")[0]
        return (
            f"let the layer create a namespace of its own (another {key}), or set "
            f"{section}.createNamespace: false to use this one without owning it (destroy then "
            "leaves it)"
        )
    return (
        "rename it in the stack config where its name is a setting, or remove it from the "
        "cluster if nobody uses it; the stack never takes over an object it did not create"
    )


def object_problems(
    declared: Sequence[Declared],
    live: Iterable[LiveObject],
    claim: LiveClaim | None,
    stack_id: str | None,
    *,
    retake: bool,
) -> list[Problem]:
    """The declared objects that already exist and are not this stack's, one problem each."""
    existing = {o.ref: o for o in live}
    problems = []
    for item in sorted(declared, key=lambda d: d.ref):
        found = existing.get(item.ref)
        if found is None or _ours(found, claim, stack_id, retake):
            continue
        allowed = (
            _release_problem(item, found)
            if item.ref.is_helm_release
            else f"{item.ref} already exists and this stack did not create it"
            f"{_why_not_ours(found, claim, stack_id)} (`up` would take it over and `destroy` "
            "would delete it); " + _ways_out(item)
        )
        problems.append(
            Problem(
                key=item.key,
                value=item.ref.name if item.key.endswith(".namespace") else str(item.ref),
                allowed=allowed,
            )
        )
    return problems


def _create_namespace_key(key: str) -> str:
    """The createNamespace key beside namespace key `key` (`gpuOperator.namespace`)."""
    section, dot, _ = key.rpartition(".")
    return f"{section}.createNamespace" if dot else "createNamespace"


def _label_refusal(name: str, key: str, need: NamespaceLabel, have: str | None) -> str:
    create = _create_namespace_key(key)
    found = f"has no label {need.key}" if have is None else f"has {need.key}={have}"
    overwrite = "" if have is None else " --overwrite"
    return (
        f"namespace {name} {found}; with {create}: false it must carry {need.key}={need.value} "
        f"({need.why}): label it (`kubectl label namespace {name} {need.key}={need.value}"
        f"{overwrite}`), or set {create}: true to let the layer create it"
    )


def namespace_problems(
    used: Mapping[str, UsedNamespace], live: Mapping[str, Mapping[str, str]]
) -> list[Problem]:
    """Namespaces a layer uses without creating them (`used`: {name: its key and needs}) that
    do not exist (`live`: {name: labels} of those that do), or that lack a label the layer's
    pods need or carry another value: every problem, one a label, by namespace."""
    problems = []
    for name, use in sorted(used.items()):
        labels = live.get(name)
        if labels is None:
            create = _create_namespace_key(use.key)
            problems.append(
                Problem(
                    key=use.key,
                    value=name,
                    allowed=f"no such namespace; with {create}: false the namespace must exist "
                    f"before `up` (create it, or set {create}: true to let the layer create it)",
                )
            )
            continue
        problems.extend(
            Problem(
                key=use.key,
                value=name,
                allowed=_label_refusal(name, use.key, need, labels.get(need.key)),
            )
            for need in use.needs
            if labels.get(need.key) != need.value
        )
    return problems


# --------------------------------------------------------------------------- reading the cluster


Get = Callable[[str, Sequence[tuple[str, str]]], Any]
"""GET a path with query parameters as JSON; None when the API server answers 404."""


def api_get(api: Any) -> Get:
    """`Get` through a kubernetes.client.ApiClient."""

    def get(path: str, query: Sequence[tuple[str, str]] = ()) -> Any:
        from kubernetes.client.exceptions import ApiException

        request = api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=list(query),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*request, _request_timeout=READ_TIMEOUT_S)
        body = response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason)
        return json.loads(body)

    return get


def connect(kubeconfig: str, context: str | None) -> ClusterReader:
    """A reader of the cluster that `kubeconfig` (content) reaches."""
    from components.providers.node_api import api_client_from_kubeconfig

    return ClusterReader(api_get(api_client_from_kubeconfig(kubeconfig, context)))


class ClusterReader:
    """The live reads of the check."""

    def __init__(self, get: Get) -> None:
        self._get = get
        self._kinds: dict[str, dict[str, tuple[str, bool]] | None] = {}

    def _resources(self, api_version: str) -> dict[str, tuple[str, bool]] | None:
        """{kind: (plural, namespaced)} the API server serves for `api_version`; None when it
        serves no such group version (a CRD not installed yet)."""
        if api_version not in self._kinds:
            path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            listing = self._get(path, ())
            self._kinds[api_version] = (
                None
                if listing is None
                else {
                    r["kind"]: (r["name"], bool(r.get("namespaced")))
                    for r in listing.get("resources", [])
                    if "/" not in r["name"]
                }
            )
        return self._kinds[api_version]

    def read(self, ref: ObjectRef) -> Mapping[str, Any] | None:
        """The object's JSON, or None when it does not exist. A Helm release is not an object:
        `read_release` finds it."""
        kinds = self._resources(ref.api_version)
        if kinds is None or ref.kind not in kinds:
            return None
        plural, namespaced = kinds[ref.kind]
        base = (
            f"/api/{ref.api_version}" if "/" not in ref.api_version else f"/apis/{ref.api_version}"
        )
        where = f"/namespaces/{ref.namespace or 'default'}" if namespaced else ""
        return self._get(f"{base}{where}/{plural}/{ref.name}", ())

    def read_release(self, ref: ObjectRef) -> tuple[str, Mapping[str, Any]] | None:
        """(kind, object) of a storage object of Helm release `ref` (the first of its revisions
        the API server lists), from its Secrets, else its ConfigMaps (HELM_DRIVER=configmap):
        one LIST each, of one item; None when neither storage holds the release."""
        for plural, kind in HELM_STORAGES:
            listing = self._get(
                f"/api/v1/namespaces/{ref.namespace}/{plural}",
                [("labelSelector", f"owner=helm,name={ref.name}"), ("limit", "1")],
            )
            items = (listing or {}).get("items") or []
            if items:
                return kind, items[0]
        return None

    def live_objects(self, refs: Iterable[ObjectRef]) -> list[LiveObject]:
        found = []
        for ref in sorted(set(refs)):
            if ref.is_helm_release:
                release = self.read_release(ref)
                if release is not None:
                    found.append(_live_release(ref, *release))
                continue
            obj = self.read(ref)
            if obj is None:
                continue
            metadata = obj.get("metadata") or {}
            labels = metadata.get("labels") or {}
            annotations = metadata.get("annotations") or {}
            holder = str((obj.get("spec") or {}).get("holderIdentity") or "")
            part_of = (
                PART_OF.items() <= labels.items()
                # A leader-election Lease its own Deployment's pods took before the stack
                # declared it (their names start with the Deployment's, which is the Lease's).
                or (ref.kind == "Lease" and holder.startswith(f"{ref.name}-"))
            )
            mark = annotations.get(STACK_MARK)
            found.append(
                LiveObject(
                    ref=ref,
                    part_of=part_of,
                    forced=annotations.get(PATCH_FORCE) == "true",
                    stack=str(mark) if mark is not None else None,
                    uid=str(metadata.get("uid") or ""),
                )
            )
        return found

    def namespaces(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        """{name: labels} of the namespaces of `names` that exist (one GET each)."""
        found = {}
        for name in sorted(set(names)):
            obj = self._get(f"/api/v1/namespaces/{name}", ())
            if obj is not None:
                labels = (obj.get("metadata") or {}).get("labels") or {}
                found[name] = {str(k): str(v) for k, v in labels.items()}
        return found


def release_record(kind: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The release Helm stored in `obj` (a Secret or ConfigMap of its storage): its `release`
    data, Helm's base64 of gzipped JSON (a Secret's data is base64 once more); {} when it
    cannot be read."""
    data = (obj.get("data") or {}).get("release")
    if not isinstance(data, str):
        return {}
    try:
        raw = base64.b64decode(data)
        if kind == "Secret":
            raw = base64.b64decode(raw)
        if raw[:3] == b"\x1f\x8b\x08":
            raw = gzip.decompress(raw)
        record = json.loads(raw)
    except (binascii.Error, OSError, EOFError, ValueError):
        return {}
    return record if isinstance(record, Mapping) else {}


def _live_release(ref: ObjectRef, kind: str, obj: Mapping[str, Any]) -> LiveObject:
    """Helm release `ref` as found in storage object `obj` of `kind`: the stack's mark in its
    values, its first deployment's time for its UID."""
    record = release_record(kind, obj)
    values = record.get("config") or {}
    info = record.get("info") or {}
    mark = values.get(STACK_MARK) if isinstance(values, Mapping) else None
    name = (obj.get("metadata") or {}).get("name") or ""
    return LiveObject(
        ref=ref,
        part_of=False,
        stack=str(mark) if mark is not None else None,
        uid=str(info.get("first_deployed") or "") if isinstance(info, Mapping) else "",
        stored_as=f"{kind} {ref.namespace}/{name}",
    )


def marked_values(values: Any, stack_id: pulumi.Input[str]) -> pulumi.Output[Any]:
    """A Helm release's `values` with the stack's mark (STACK_MARK: its id): Helm keeps the
    values with every revision from the install's first record on, so a release this stack
    installed says so even when the install failed or was cut off. Charts read no such key."""
    return pulumi.Output.all(pulumi.Output.from_input(values or {}), stack_id).apply(
        lambda v: {**(v[0] or {}), STACK_MARK: v[1]}
    )


def read_claim(
    reader: ClusterReader, namespace: str, name: str, keys: ClaimKeys
) -> LiveClaim | None:
    """The claim the cluster holds, None when there is none."""
    obj = reader.read(ObjectRef("v1", "ConfigMap", namespace, name))
    if obj is None:
        return None
    data = obj.get("data") or {}
    return LiveClaim(
        stack_id=str(data.get(keys.stack_id, "")),
        stack_label=str(data.get(keys.stack_label, "")),
        objects=parse_objects_record(data.get(keys.objects)),
    )


@dataclass(frozen=True)
class ClaimKeys:
    """The claim's data keys."""

    stack_id: str
    stack_label: str
    objects: str


# --------------------------------------------------------------------------- the program side


class OwnershipError(pulumi.RunError):
    """The stack may not go on with this cluster: every reason, each naming the config key,
    the value and the ways out. A RunError alone (not a ValueError), so the engine shows the
    message without a stack trace wherever the claim's inputs fail."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"nothing was applied: this stack may not go on with the cluster "
            f"({len(self.problems)} problem(s)):\n{lines}"
        )


@dataclass
class Ownership:
    """Collects what the program declares, then checks it live once (`seal`).

    `verified` resolves to the record of the declared objects (for the claim, with the UIDs it
    vouches for) once the check passed; otherwise it fails with an OwnershipError naming every problem, and so does every
    resource that waits for the claim (all but the state-only stack id).
    """

    stack_id: pulumi.Output[str]
    stack_label: str
    retake: bool
    kubeconfig: str = field(repr=False)
    context: str | None
    claim_where: tuple[str, str]
    keys: ClaimKeys
    used_namespaces: dict[str, UsedNamespace] = field(default_factory=dict)
    """{namespace name: its config key and the labels its layer needs} of the namespaces layers
    use without creating them."""
    declared: list[Declared] = field(default_factory=list)
    _result: asyncio.Future[str] = field(init=False, repr=False)
    _task: asyncio.Future[None] | None = field(default=None, init=False, repr=False)
    _sealed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._result = asyncio.get_event_loop().create_future()

    @property
    def verified(self) -> pulumi.Output[str]:
        known: asyncio.Future[bool] = asyncio.get_event_loop().create_future()
        known.set_result(True)
        secret: asyncio.Future[bool] = asyncio.get_event_loop().create_future()
        secret.set_result(False)
        return pulumi.Output(set(), self._result, known, secret)

    def declare(self, ref: ObjectRef, key: str) -> None:
        if self._sealed:
            raise RuntimeError(f"{ref} declared after the ownership check was sealed")
        self.declared.append(Declared(ref, key))

    def use_namespace(self, name: str, key: str, needs: Iterable[NamespaceLabel] = ()) -> None:
        """A layer uses namespace `name` (named by config key `key`) without creating it: it
        must exist, with the labels of `needs`."""
        if self._sealed:
            raise RuntimeError(f"namespace {name} used after the ownership check was sealed")
        earlier = self.used_namespaces.get(name)
        kept = earlier.needs if earlier is not None else ()
        self.used_namespaces[name] = UsedNamespace(
            earlier.key if earlier is not None else key, (*kept, *needs)
        )

    def abandon(self, error: BaseException) -> None:
        """The program failed before seal(): the verdict is `error`, so the claim and what
        waits for it fail instead of waiting for a check that never comes."""
        self._sealed = True
        if not self._result.done():
            self._result.set_exception(error)

    def seal(self) -> None:
        """Everything is declared: read the claim and the declared objects on the cluster, and
        write the claim (which everything waits for) only if the stack may go on."""
        self._sealed = True
        result = self._result
        refs = [d.ref for d in self.declared]
        try:
            reader = connect(self.kubeconfig, self.context)
            claim = read_claim(reader, *self.claim_where, self.keys)
            live = reader.live_objects(refs)
            namespaces = reader.namespaces(self.used_namespaces)
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            message = (
                "the claim and the objects this stack declares could not be checked on the "
                f"cluster: {reason}"
            )
            if pulumi.runtime.is_dry_run():
                pulumi.log.warn(f"{message}; `pulumi up` checks them before applying anything")
                result.set_result(objects_record(refs))
            else:
                problem = Problem(key="kubeconfig", value=NOT_SHOWN, allowed=message)
                result.set_exception(OwnershipError([problem]))
            return

        async def check() -> None:
            known = await self.stack_id.is_known()
            stack_id = await self.stack_id.future() if known else None
            where = "/".join(self.claim_where)
            problems = [
                *claim_problems(
                    claim,
                    stack_id,
                    self.stack_label,
                    retake=self.retake,
                    where=where,
                    applied=applied_here(live, stack_id),
                ),
                *object_problems(self.declared, live, claim, stack_id, retake=self.retake),
                *namespace_problems(self.used_namespaces, namespaces),
            ]
            if problems:
                result.set_exception(OwnershipError(problems))
            else:
                uids = vouched_uids(live, claim, stack_id, retake=self.retake)
                result.set_result(objects_record(refs, uids))

        async def checked() -> None:
            # Whatever goes wrong reaches what waits for the verdict: an unanswered verdict
            # would hold the whole program forever.
            try:
                await check()
            except BaseException as exc:
                if not result.done():
                    result.set_exception(exc)
                raise

        self._task = asyncio.ensure_future(checked())
