"""Dynamic provider: admission plugins and feature gates in kubeadm's ClusterConfiguration.

kubeadm regenerates every control-plane static pod manifest from the ClusterConfiguration
stored in the kube-system/kubeadm-config ConfigMap, so that is where a flag must live to
survive `kubeadm upgrade`. This provider edits it through the API: it parses the document with
PyYAML, adds the admission plugins to `apiServer.extraArgs` and the feature gates to the
apiServer, controllerManager and scheduler extraArgs, and writes it back with a
resourceVersion precondition, retrying on conflict. What it added (and what an entry it changed
held before) is recorded in an annotation named after the stack, so delete takes out exactly
that and leaves everything else, including entries that were there before, as it found them.

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
PLUGINS_FLAG = "enable-admission-plugins"
GATES_FLAG = "feature-gates"
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
    plugins: list[str], gates: Mapping[str, bool]
) -> dict[str, dict[str, dict[str, str]]]:
    """{component: {flag: {item: value}}}: plugins on the API server, gates on all three."""
    wanted: dict[str, dict[str, dict[str, str]]] = {}
    if plugins:
        wanted.setdefault("apiServer", {})[PLUGINS_FLAG] = {p: "" for p in plugins}
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


def annotation_key(stack: str) -> str:
    """The annotation recording what `stack` added (a qualified name: 63 characters at most)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", stack).strip("-_.")[:63] or "stack"
    return f"{ANNOTATION_PREFIX}/{name}"


def record_name(stack: str) -> str:
    """The stack's name as its annotation spells it (how other stacks' errors name it)."""
    return annotation_key(stack)[len(ANNOTATION_PREFIX) + 1 :]


def other_records(cm: Mapping[str, Any], stack: str) -> dict[str, Record]:
    """The records of the stacks other than `stack` on the ConfigMap, by stack."""
    annotations = (cm.get("metadata") or {}).get("annotations") or {}
    prefix = f"{ANNOTATION_PREFIX}/"
    return {
        key[len(prefix) :]: dict(json.loads(value or "{}"))
        for key, value in annotations.items()
        if key.startswith(prefix) and key != annotation_key(stack)
    }


def set_configuration(stack: str, wanted: Mapping[str, Mapping[str, Mapping[str, str]]]) -> Mutate:
    """A mutate function for read_modify_write: make the stack's additions exactly `wanted`.

    Raises StackConflict (naming the items and stacks) when another stack set one otherwise.
    """
    key = annotation_key(stack)

    def mutate(cm: Mapping[str, Any]) -> dict[str, Any] | None:
        text = (cm.get("data") or {}).get(DATA_KEY)
        if text is None:
            raise NodeApiError(f"ConfigMap {NAMESPACE}/{CONFIGMAP} has no data key {DATA_KEY}")
        document = yaml.safe_load(text)
        if not isinstance(document, dict):
            raise NodeApiError(
                f"ConfigMap {NAMESPACE}/{CONFIGMAP}: {DATA_KEY} is not a YAML mapping"
            )
        annotations = (cm.get("metadata") or {}).get("annotations") or {}
        previous: Record = json.loads(annotations.get(key) or "{}")
        others = other_records(cm, stack)
        try:
            record = edit_cluster_configuration(
                document, previous, wanted, others, record_name(stack)
            )
        except StackConflict as exc:
            prefix = f"ConfigMap {NAMESPACE}/{CONFIGMAP}: "
            raise StackConflict([prefix + c for c in exc.conflicts]) from None
        new_text = yaml.safe_dump(document, sort_keys=False)
        if record == previous and yaml.safe_load(new_text) == yaml.safe_load(text):
            return None
        return {
            "metadata": {
                "annotations": {key: json.dumps(record, sort_keys=True) if record else None}
            },
            "data": {DATA_KEY: new_text},
        }

    return mutate


def recorded(cm: Mapping[str, Any], stack: str) -> Record:
    """What the ConfigMap's annotation says `stack` added."""
    annotations = (cm.get("metadata") or {}).get("annotations") or {}
    return dict(json.loads(annotations.get(annotation_key(stack)) or "{}"))


# --------------------------------------------------------------------------- provider


def _wanted(props: Mapping[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    return wanted_items(list(props.get("admission_plugins") or []), props.get("gates") or {})


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
            set_configuration(props["stack"], _wanted(props)),
        )
        return {**props, "added": recorded(cm, props["stack"]), "in_sync": True}

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
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
        if isinstance(news.get("stack"), str):
            wanted = _wanted({**news, "gates": gates})
            failures += [
                CheckFailure("feature_gates", reason)
                for reason in self._conflicts(api, news["stack"], wanted)
            ]
        return CheckResult(inputs={**news, "gates": gates, "notes": notes}, failures=failures)

    @staticmethod
    def _conflicts(
        api: ConfigMapApi, stack: str, wanted: Mapping[str, Mapping[str, Mapping[str, str]]]
    ) -> list[str]:
        """Gates another stack set to the other value, so a preview fails before any change."""
        try:
            cm = api.get_configmap(NAMESPACE, CONFIGMAP)
            document = yaml.safe_load((cm.get("data") or {}).get(DATA_KEY) or "{}")
            if not isinstance(document, dict):
                return []  # create says what is wrong with it
            others = other_records(cm, stack)
            edit_cluster_configuration(
                document, recorded(cm, stack), wanted, others, record_name(stack)
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
        fields = ("admission_plugins", "gates", "notes")
        changed = [k for k in fields if olds.get(k) != news.get(k)]
        replaces = ["stack"] if olds.get("stack") != news.get("stack") else []
        if olds.get("in_sync") is False:
            changed.append("in_sync")  # changed behind the stack's back: put it back
        return DiffResult(
            changes=bool(changed or replaces), replaces=replaces, delete_before_replace=True
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        cm = self._api(props).get_configmap(NAMESPACE, CONFIGMAP)
        # In sync when applying the configuration again would change nothing (a conflict with
        # another stack is a change; the update then says what it is).
        try:
            in_sync = set_configuration(props["stack"], _wanted(props))(cm) is None
        except StackConflict:
            in_sync = False
        return ReadResult(id_=id_, outs={**props, "in_sync": in_sync})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        api = self._api(props)
        read_modify_write(
            lambda: api.get_configmap(NAMESPACE, CONFIGMAP),
            lambda patch: api.merge_patch_configmap(NAMESPACE, CONFIGMAP, patch),
            set_configuration(props["stack"], {}),
        )


class KubeadmConfig(Resource, module=PROJECT, name="KubeadmConfig"):
    """One stack's admission plugins and feature gates in kubeadm's ClusterConfiguration."""

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
        admission_plugins: pulumi.Input[list[str]],
        feature_gates: pulumi.Input[Mapping[str, bool]],
        opts: pulumi.ResourceOptions | None = None,
        provider: KubeadmConfigProvider | None = None,
    ) -> None:
        props = {
            "stack": stack,
            "admission_plugins": admission_plugins,
            "feature_gates": feature_gates,
            "gates": None,
            "notes": None,
            "added": None,
        }
        super().__init__(provider or KubeadmConfigProvider(), name, props, opts)
