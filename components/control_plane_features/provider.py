"""Dynamic provider: admission plugins and feature gates in kubeadm's ClusterConfiguration.

kubeadm regenerates every control-plane static pod manifest from the ClusterConfiguration
stored in the kube-system/kubeadm-config ConfigMap, so that is where a flag must live to
survive `kubeadm upgrade`. This provider edits it through the API: it parses the document with
PyYAML, adds the admission plugins to `apiServer.extraArgs` and the feature gates to the
apiServer, controllerManager and scheduler extraArgs, and writes it back with a
resourceVersion precondition, retrying on conflict. What it added (and what an entry it changed
held before) is recorded in an annotation named by the stack's id (node_api.stack_identity:
minted on the first `up`, kept in the state, so `pulumi stack rename` keeps it), with the
readable organization/project/stack beside it, so delete takes out exactly that and leaves
everything else, including entries that were there before, as it found them. Records an
earlier version keyed by the stack's name (the `stack` its state holds) are adopted as this
stack's on the next `up`: merged into the id's record and removed in the same write.

Stacks sharing a cluster share the document: an item another stack's annotation also names is
recorded by each of them (with the value from before the first), and taking a stack out
leaves it while any other stack still wants it; the last one puts the old value back. A gate
another stack set to the other value is refused, naming that stack (at preview too).

`check` asks the live API server which gates exist and at which stage
(`kubernetes_feature_enabled{name,stage}` on /metrics): an unknown gate is refused; a GA gate
asked for at its locked value is left out with a note; a GA gate asked for at the other value
is refused (the component would not start).

# Ref: https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-reconfigure/
# Ref: https://kubernetes.io/docs/reference/config-api/kubeadm-config.v1beta4/
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pulumi
import yaml
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    UpdateResult,
)

from components.providers.credentials import RunCredentials
from components.providers.node_api import (
    FIELD_MANAGER,
    Mutate,
    NodeApiError,
    api_client_from_kubeconfig,
    call_api,
    read_modify_write,
)
from components.settings import PROJECT

NAMESPACE = "kube-system"
CONFIGMAP = "kubeadm-config"
DATA_KEY = "ClusterConfiguration"
ANNOTATION_PREFIX = f"kubeadm-config.{PROJECT}.io"
"""Prefix of the annotations holding each stack's record, `<prefix>/<stack id>`."""
LABEL_PREFIX = f"stack.{ANNOTATION_PREFIX}"
"""Prefix of the annotations naming each record's stack for a reader (organization/project/
stack), `<prefix>/<stack id>`: outside ANNOTATION_PREFIX, so only records are read as records."""
PLUGINS_FLAG = "enable-admission-plugins"
GATES_FLAG = "feature-gates"
RUNTIME_CONFIG_FLAG = "runtime-config"
GATE_COMPONENTS = ("apiServer", "controllerManager", "scheduler")
"""ClusterConfiguration sections whose component takes --feature-gates."""

Record = dict[str, dict[str, dict[str, str | None]]]
"""{component: {flag: {item: value before the stack, or None when it was absent}}}."""
CREATED = ""
"""The record's flag key meaning "the stack created this section"."""


class StackConflict(NodeApiError):
    """Another stack set an item this stack wants to a different value."""

    def __init__(self, conflicts: list[str]) -> None:
        super().__init__("; ".join(conflicts))
        self.conflicts = conflicts


class ConfigMapApi(Protocol):
    """The calls the provider makes. Objects travel as plain JSON dicts."""

    server: str

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any]: ...

    def merge_patch_configmap(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Apply a JSON merge patch; a metadata.resourceVersion in it is a precondition."""
        ...

    def metrics(self) -> str:
        """The API server's /metrics text."""
        ...


class KubeConfigMapApi:
    """ConfigMapApi over the official kubernetes client."""

    def __init__(self, kubeconfig: str, context: str | None) -> None:
        from kubernetes import client

        self._client = api_client_from_kubeconfig(kubeconfig, context)
        self.server = str(self._client.configuration.host)
        self._core = client.CoreV1Api(self._client)

    def _json(self, subject: str, what: str, fn: Callable[[], Any]) -> dict[str, Any]:
        return dict(json.loads(call_api(self.server, subject, what, fn).data))

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json(
            f"ConfigMap {namespace}/{name}",
            "read",
            lambda: self._core.read_namespaced_config_map(name, namespace, _preload_content=False),
        )

    def merge_patch_configmap(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self._json(
            f"ConfigMap {namespace}/{name}",
            "patch",
            lambda: self._core.patch_namespaced_config_map(
                name,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            ),
        )

    def metrics(self) -> str:
        from kubernetes.client.exceptions import ApiException

        def get() -> Any:
            request = self._client.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
            response = self._client.call_api(*request)
            response.read()
            if not 200 <= response.status < 300:
                raise ApiException(http_resp=response)
            return response

        return str(call_api(self.server, "/metrics", "read", get).data.decode())


Connect = Callable[[str, "str | None"], ConfigMapApi]


def connect(kubeconfig: str, context: str | None) -> ConfigMapApi:
    """The production ConfigMapApi factory; the provider takes another one in tests."""
    return KubeConfigMapApi(kubeconfig, context)


# --------------------------------------------------------------------------- gates


_METRIC = re.compile(
    r'^kubernetes_feature_enabled\{(?=[^}]*name="(?P<name>[^"]+)")(?=[^}]*stage="(?P<stage>[^"]*)")'
    r"[^}]*\}\s+(?P<value>[0-9.eE+-]+)\s*$"
)


def feature_stages(metrics: str) -> dict[str, tuple[str, bool]]:
    """{gate: (stage, enabled)} from `kubernetes_feature_enabled` samples; GA has stage ""."""
    gates: dict[str, tuple[str, bool]] = {}
    for line in metrics.splitlines():
        match = _METRIC.match(line)
        if match:
            gates[match["name"]] = (match["stage"], float(match["value"]) == 1.0)
    return gates


def check_gates(
    wanted: Mapping[str, bool], stages: Mapping[str, tuple[str, bool]], server: str
) -> tuple[dict[str, bool], dict[str, str], list[str]]:
    """Split the requested gates into (to set, left out with a note, refusals)."""
    effective: dict[str, bool] = {}
    notes: dict[str, str] = {}
    refused: list[str] = []
    for gate, value in wanted.items():
        if gate not in stages:
            refused.append(
                f"feature gate {gate!r} is unknown to the API server {server} "
                "(not in its kubernetes_feature_enabled metric)"
            )
            continue
        stage, enabled = stages[gate]
        if stage == "" and enabled == value:
            notes[gate] = f"GA and locked to {str(value).lower()}: nothing to set"
        elif stage == "":
            refused.append(
                f"feature gate {gate!r} is GA and locked to {str(enabled).lower()} on the API "
                f"server {server}; it cannot be set to {str(value).lower()}"
            )
        else:
            effective[gate] = value
    return effective, notes, refused


# --------------------------------------------------------------------------- ClusterConfiguration


def _parse_items(value: str) -> dict[str, str]:
    """`A,B=true` -> {"A": "", "B": "true"} (order kept)."""
    items: dict[str, str] = {}
    for part in value.split(","):
        part = part.strip()
        if part:
            name, _, item = part.partition("=")
            items[name.strip()] = item.strip()
    return items


def _format_items(items: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" if v else k for k, v in items.items())


def _get_arg(section: Mapping[str, Any], flag: str) -> str | None:
    args = section.get("extraArgs")
    if isinstance(args, list):  # v1beta4: [{name, value}]
        for entry in args:
            if isinstance(entry, Mapping) and entry.get("name") == flag:
                return str(entry.get("value", ""))
        return None
    if isinstance(args, Mapping):  # v1beta3: {name: value}
        value = args.get(flag)
        return None if value is None else str(value)
    return None


def _set_arg(section: dict[str, Any], flag: str, value: str | None, v1beta4: bool) -> None:
    """Set (or with None, remove) one extraArgs entry, in whichever form the document uses."""
    args = section.get("extraArgs")
    if args is None:
        args = [] if v1beta4 else {}
    if isinstance(args, list):
        index = next(
            (i for i, e in enumerate(args) if isinstance(e, Mapping) and e.get("name") == flag),
            None,
        )
        if value is None and index is not None:
            del args[index]
        elif value is not None and index is not None:
            args[index] = {**args[index], "value": value}
        elif value is not None:
            args.append({"name": flag, "value": value})
    else:
        args = dict(args)
        if value is None:
            args.pop(flag, None)
        else:
            args[flag] = value
    if args:
        section["extraArgs"] = args
    else:
        section.pop("extraArgs", None)


def wanted_items(
    plugins: list[str], gates: Mapping[str, bool], runtime_config: Mapping[str, bool] | None = None
) -> dict[str, dict[str, dict[str, str]]]:
    """{component: {flag: {item: value}}}: plugins and API versions on the API server, gates
    on all three."""
    wanted: dict[str, dict[str, dict[str, str]]] = {}
    if plugins:
        wanted.setdefault("apiServer", {})[PLUGINS_FLAG] = {p: "" for p in plugins}
    if runtime_config:
        wanted.setdefault("apiServer", {})[RUNTIME_CONFIG_FLAG] = {
            gv: str(on).lower() for gv, on in runtime_config.items()
        }
    if gates:
        values = {g: str(v).lower() for g, v in gates.items()}
        for component in GATE_COMPONENTS:
            wanted.setdefault(component, {})[GATES_FLAG] = dict(values)
    return wanted


@dataclass
class _Sections:
    """The ClusterConfiguration's component sections, edited in place, in the document's own
    extraArgs form; remembers the sections it had to create."""

    document: dict[str, Any]
    created: set[str] = field(default_factory=set)
    v1beta4: bool = field(init=False)
    """New extraArgs are written as v1beta4's [{name, value}] list, else as a mapping."""

    def __post_init__(self) -> None:
        self.v1beta4 = str(self.document.get("apiVersion", "")).endswith("/v1beta4")

    def items(self, component: str, flag: str) -> dict[str, str]:
        """The items of `flag` in `component`'s extraArgs ({} when either is absent)."""
        section = self.document.get(component)
        return _parse_items(_get_arg(section, flag) or "") if isinstance(section, dict) else {}

    def store(self, component: str, flag: str, items: Mapping[str, str]) -> None:
        """Write `items` back as `flag` (removed when empty), creating the section if needed."""
        section = self.document.get(component)
        if not isinstance(section, dict):
            if not items:
                return
            section = self.document[component] = {}
            self.created.add(component)
        _set_arg(section, flag, _format_items(items) or None, self.v1beta4)


def _holders(others: Mapping[str, Record], component: str, flag: str, item: str) -> list[str]:
    """The other stacks that want `item` (their records name it)."""
    return sorted(
        name for name, rec in others.items() if item in rec.get(component, {}).get(flag, {})
    )


def _undo(sections: _Sections, previous: Record, others: Mapping[str, Record]) -> None:
    """Take out what `previous` added and put back what it changed, except items another
    stack still wants; drop a section the stack created that is empty now."""
    for component, flags in previous.items():
        for flag, before in flags.items():
            if flag == CREATED:
                continue
            items = sections.items(component, flag)
            for item, old in before.items():
                if _holders(others, component, flag, item):
                    continue  # another stack still wants it
                if old is None:
                    items.pop(item, None)
                else:
                    items[item] = old
            sections.store(component, flag, items)
        if CREATED in flags and sections.document.get(component) == {}:
            del sections.document[component]


def _add(
    sections: _Sections,
    wanted: Mapping[str, Mapping[str, Mapping[str, str]]],
    others: Mapping[str, Record],
    stack: str,
) -> Record:
    """Set every wanted item and return the record of what was there before; raises
    StackConflict when another stack set a wanted item to a different value."""
    record: Record = {}
    conflicts: dict[tuple[str, str], str] = {}
    for component, wanted_flags in wanted.items():
        for flag, want in wanted_flags.items():
            items = sections.items(component, flag)
            for item, new in want.items():
                shared = _holders(others, component, flag, item)
                if shared and items.get(item) != new:
                    conflicts.setdefault(
                        (flag, item),
                        f"{flag} item {item} of {component} is set to {items.get(item)} by "
                        f"stack {shared[0]}; stack {stack} wants {new} (stacks sharing a "
                        "cluster must agree on a gate's value)",
                    )
                elif shared:  # the value from before the first stack, for the last to restore
                    first = others[shared[0]][component][flag][item]
                    record.setdefault(component, {}).setdefault(flag, {})[item] = first
                elif items.get(item) != new:
                    record.setdefault(component, {}).setdefault(flag, {})[item] = items.get(item)
                    items[item] = new
            sections.store(component, flag, items)
    if conflicts:
        raise StackConflict(list(conflicts.values()))
    return record


def _mark_created(record: Record, created: set[str], others: Mapping[str, Record]) -> None:
    """A section no stack found stays marked, so whichever stack leaves last removes it."""
    for component in record.keys() | created:
        if component in created or any(CREATED in r.get(component, {}) for r in others.values()):
            record.setdefault(component, {})[CREATED] = {}


def edit_cluster_configuration(
    document: dict[str, Any],
    previous: Record,
    wanted: Mapping[str, Mapping[str, Mapping[str, str]]],
    others: Mapping[str, Record] | None = None,
    stack: str = "this stack",
) -> Record:
    """Undo `previous`, then add `wanted`; edits `document` in place, returns the new record.

    Undoing first is what makes a changed configuration converge: an item the stack added
    before and no longer wants goes away, an item it changed gets its old value back. An item
    one of `others` (the other stacks' records, by stack) names is theirs too: undoing leaves
    it, and adding records it with the value from before the first stack, so the last stack
    to leave restores it. Raises StackConflict when another stack set an item this stack wants
    to a different value.
    """
    others = others or {}
    sections = _Sections(document)
    _undo(sections, previous, others)
    record = _add(sections, wanted, others, stack)
    _mark_created(record, sections.created, others)
    return record


def record_name(stack: str) -> str:
    """`stack` (an id, or the name an earlier version keyed records by) as annotations spell
    it: a qualified name's name part, 63 characters at most."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stack).strip("-_.")[:63] or "stack"


def annotation_key(stack: str) -> str:
    """The annotation recording what `stack` added."""
    return f"{ANNOTATION_PREFIX}/{record_name(stack)}"


def label_key(stack: str) -> str:
    """The annotation naming `stack`'s record for a reader (organization/project/stack)."""
    return f"{LABEL_PREFIX}/{record_name(stack)}"


def _annotations(cm: Mapping[str, Any]) -> dict[str, str]:
    return dict((cm.get("metadata") or {}).get("annotations") or {})


def describe_stack(cm: Mapping[str, Any], name: str) -> str:
    """How a message names the stack whose record is `name`: its label when recorded (a
    record of an earlier version has only the stack's name)."""
    label = _annotations(cm).get(label_key(name))
    return f"{label} (stack id {name})" if label else name


UNKNOWN_STACK = ""
"""The stack's id while a preview does not know it (the preview of its first `up`, where a
dynamic provider's check gets a `pulumi.output.Unknown` in its place)."""


@dataclass(frozen=True)
class Owner:
    """Whose record a write keeps: the stack's id, its label, and the names an earlier version
    of the stack keyed its records by (its own wherever found)."""

    stack: str
    """The stack's id (node_api.stack_identity); UNKNOWN_STACK while a preview does not know it."""
    label: str = ""
    """organization/project/stack, written beside the record."""
    former: tuple[str, ...] = ()
    """Names the stack's records were keyed by before it had an id."""

    def keys(self) -> list[str]:
        """The annotations of this stack's records: its id's (when known), then the former."""
        own = [] if self.stack == UNKNOWN_STACK else [annotation_key(self.stack)]
        return own + [k for k in map(annotation_key, self.former) if k not in own]

    def previous(self, cm: Mapping[str, Any]) -> Record:
        """This stack's record: the id's, with what the former records hold that it lacks."""
        annotations = _annotations(cm)
        merged: Record = {}
        for key in self.keys():
            for component, flags in json.loads(annotations.get(key) or "{}").items():
                for flag, items in flags.items():
                    held = merged.setdefault(component, {}).setdefault(flag, {})
                    for item, old in items.items():
                        held.setdefault(item, old)
        return merged

    def others(self, cm: Mapping[str, Any]) -> dict[str, Record]:
        """The records of the other stacks, by how a message names each."""
        prefix = f"{ANNOTATION_PREFIX}/"
        own = set(self.keys())
        return {
            describe_stack(cm, key[len(prefix) :]): dict(json.loads(value or "{}"))
            for key, value in _annotations(cm).items()
            if key.startswith(prefix) and key not in own
        }

    def describe(self) -> str:
        """How a message names this stack."""
        if self.stack == UNKNOWN_STACK:
            return self.label or "this stack"
        return f"{self.label} (stack id {self.stack})" if self.label else self.stack


def set_configuration(
    owner: Owner, wanted: Mapping[str, Mapping[str, Mapping[str, str]]]
) -> Mutate:
    """A mutate function for read_modify_write: make the stack's additions exactly `wanted`,
    recorded under its id with its label beside, its former records folded in and removed.

    Raises StackConflict (naming the items and stacks) when another stack set one otherwise.
    """
    key = annotation_key(owner.stack)

    def mutate(cm: Mapping[str, Any]) -> dict[str, Any] | None:
        text = (cm.get("data") or {}).get(DATA_KEY)
        if text is None:
            raise NodeApiError(f"ConfigMap {NAMESPACE}/{CONFIGMAP} has no data key {DATA_KEY}")
        document = yaml.safe_load(text)
        if not isinstance(document, dict):
            raise NodeApiError(
                f"ConfigMap {NAMESPACE}/{CONFIGMAP}: {DATA_KEY} is not a YAML mapping"
            )
        annotations = _annotations(cm)
        previous = owner.previous(cm)
        try:
            record = edit_cluster_configuration(
                document, previous, wanted, owner.others(cm), owner.describe()
            )
        except StackConflict as exc:
            prefix = f"ConfigMap {NAMESPACE}/{CONFIGMAP}: "
            raise StackConflict([prefix + c for c in exc.conflicts]) from None
        changes: dict[str, str | None] = {
            key: json.dumps(record, sort_keys=True) if record else None,
            label_key(owner.stack): owner.label if record and owner.label else None,
        }
        for former in owner.former:
            if annotation_key(former) != key:
                changes |= {annotation_key(former): None, label_key(former): None}
        # Only what differs; the record compared as data, not as its JSON spelling.
        changes = {k: v for k, v in changes.items() if annotations.get(k) != v}
        if record == json.loads(annotations.get(key) or "{}"):
            changes.pop(key, None)
        new_text = yaml.safe_dump(document, sort_keys=False)
        if not changes and yaml.safe_load(new_text) == yaml.safe_load(text):
            return None
        return {"metadata": {"annotations": changes}, "data": {DATA_KEY: new_text}}

    return mutate


def recorded(cm: Mapping[str, Any], stack: str) -> Record:
    """What the ConfigMap's annotation says `stack` added."""
    return dict(json.loads(_annotations(cm).get(annotation_key(stack)) or "{}"))


# --------------------------------------------------------------------------- provider


def _wanted(props: Mapping[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    return wanted_items(
        list(props.get("admission_plugins") or []),
        props.get("gates") or {},
        props.get("runtime_config") or {},
    )


def _owner(props: Mapping[str, Any]) -> Owner:
    stack = props.get("stack")
    return Owner(
        stack if isinstance(stack, str) and stack else UNKNOWN_STACK,
        str(props.get("label") or ""),
        tuple(props.get("former") or ()),
    )


def former_keys(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """The keys the stack's records had before, from its state (`olds`): those it adopted
    already, and the state's `stack` when it is not the new one (the stack's name, as an
    earlier version keyed records). Kept, so a host missed by one run is adopted by the next."""
    former = {str(k) for k in olds.get("former") or ()}
    old = olds.get("stack")
    if isinstance(old, str) and old:
        former.add(old)
    former.discard(_owner(news).stack)
    return sorted(former)


class KubeadmConfigProvider(RunCredentials):
    """CRUD for one stack's additions to kube-system/kubeadm-config."""

    def __init__(self, connect_api: Connect = connect) -> None:
        super().__init__()
        self._connect = connect_api

    def _api(self, _props: Mapping[str, Any]) -> ConfigMapApi:
        return self._connect(*self.credentials())

    def _apply(self, props: Mapping[str, Any]) -> dict[str, Any]:
        api = self._api(props)
        cm = read_modify_write(
            lambda: api.get_configmap(NAMESPACE, CONFIGMAP),
            lambda patch: api.merge_patch_configmap(NAMESPACE, CONFIGMAP, patch),
            set_configuration(_owner(props), _wanted(props)),
        )
        return {**props, "added": recorded(cm, props["stack"]), "in_sync": True}

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        news = {**news, "former": former_keys(olds, news)}
        requested = news.get("feature_gates") or {}
        if not requested:
            return CheckResult(inputs={**news, "gates": requested, "notes": {}}, failures=[])
        api = self._api(news)
        try:
            stages = feature_stages(api.metrics())
        except NodeApiError as exc:
            return CheckResult(
                inputs=news,
                failures=[CheckFailure("feature_gates", f"cannot check the feature gates: {exc}")],
            )
        gates, notes, refused = check_gates(requested, stages, api.server)
        failures = [CheckFailure("feature_gates", reason) for reason in refused]
        wanted = _wanted({**news, "gates": gates})
        failures += [
            CheckFailure("feature_gates", reason)
            for reason in self._conflicts(api, _owner(news), wanted)
        ]
        return CheckResult(inputs={**news, "gates": gates, "notes": notes}, failures=failures)

    @staticmethod
    def _conflicts(
        api: ConfigMapApi, owner: Owner, wanted: Mapping[str, Mapping[str, Mapping[str, str]]]
    ) -> list[str]:
        """Gates another stack set to the other value, so a preview fails before any change.
        At the first `up`'s preview the stack's id is not known: its own records are then the
        former ones only (a new stack has none)."""
        try:
            cm = api.get_configmap(NAMESPACE, CONFIGMAP)
            document = yaml.safe_load((cm.get("data") or {}).get(DATA_KEY) or "{}")
            if not isinstance(document, dict):
                return []  # create says what is wrong with it
            edit_cluster_configuration(
                document, owner.previous(cm), wanted, owner.others(cm), owner.describe()
            )
        except StackConflict as exc:
            return exc.conflicts
        except NodeApiError:
            # Unreadable here: create reads it again, says what is wrong, and refuses a
            # conflict all the same.
            return []
        return []

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(
            id_=f"{NAMESPACE}/{CONFIGMAP}:{props['stack']}", outs=self._apply(props)
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._apply(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A new key (the id in place of the name an earlier version used) or a new label (a
        # renamed stack) is an update: the record moves, nothing is taken out and put back.
        fields = ("admission_plugins", "gates", "notes", "stack", "label", "former")
        changed = [k for k in fields if olds.get(k) != news.get(k)]
        # Absent in the state of a stack that never set one.
        if (olds.get("runtime_config") or {}) != (news.get("runtime_config") or {}):
            changed.append("runtime_config")
        if olds.get("in_sync") is False:
            changed.append("in_sync")  # changed behind the stack's back: put it back
        return DiffResult(changes=bool(changed), replaces=[])

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        cm = self._api(props).get_configmap(NAMESPACE, CONFIGMAP)
        # In sync when applying the configuration again would change nothing (a conflict with
        # another stack is a change; the update then says what it is).
        try:
            in_sync = set_configuration(_owner(props), _wanted(props))(cm) is None
        except StackConflict:
            in_sync = False
        return ReadResult(id_=id_, outs={**props, "in_sync": in_sync})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        api = self._api(props)
        read_modify_write(
            lambda: api.get_configmap(NAMESPACE, CONFIGMAP),
            lambda patch: api.merge_patch_configmap(NAMESPACE, CONFIGMAP, patch),
            set_configuration(_owner(props), {}),
        )


class KubeadmConfig(Resource, module=PROJECT, name="KubeadmConfig"):
    """One stack's admission plugins and feature gates in kubeadm's ClusterConfiguration."""

    stack: pulumi.Output[str]
    """The stack's id, which keys its record (and its directory on the hosts)."""
    former: pulumi.Output[list[str]]
    """The names an earlier version keyed the stack's record and host directories by: adopted
    as the stack's wherever found."""
    gates: pulumi.Output[dict[str, bool]]
    """The feature gates set: the requested ones minus those GA at the requested value."""
    notes: pulumi.Output[dict[str, str]]
    """Requested gates left out, with the reason."""
    added: pulumi.Output[dict[str, Any]]
    """What the stack added, or wants with other stacks: {component: {flag: {item: value
    before the first stack, or None}}}."""

    def __init__(
        self,
        name: str,
        *,
        stack: pulumi.Input[str],
        label: pulumi.Input[str],
        admission_plugins: pulumi.Input[list[str]],
        feature_gates: pulumi.Input[Mapping[str, bool]],
        runtime_config: Mapping[str, bool] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        provider: KubeadmConfigProvider | None = None,
    ) -> None:
        """`stack`: the stack's id (node_api.stack_identity); `label`: its organization/
        project/stack (node_api.stack_label), recorded beside it for a reader."""
        props = {
            "stack": stack,
            "label": label,
            "admission_plugins": admission_plugins,
            "feature_gates": feature_gates,
            "former": None,
            "gates": None,
            "notes": None,
            "added": None,
        }
        if runtime_config:  # only when set: a stack that sets none keeps its inputs as they were
            props["runtime_config"] = dict(runtime_config)
        super().__init__(provider or KubeadmConfigProvider(), name, props, opts)
