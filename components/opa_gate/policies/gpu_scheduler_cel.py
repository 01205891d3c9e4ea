"""Loads gpu_scheduler.cel.yaml, the static CEL of the native engines (beside the Rego it mirrors).

The rules are written once, in components/opa_gate/policies/gpu_scheduler.cel.yaml; the gate's configuration, the
parameter document, is written into each policy as its `config` variable (the file's
`$document`), so no parameter object stands between the cluster and the rules. The webhook,
which has no variables, gets them inlined (webhook_conditions()). The claim policies of DRA mode
(claim_variables() and the rest) have a template or claim as `params`.
components/opa_gate/manifests.py wraps these pieces into the objects.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

CEL_FILE = Path(__file__).resolve().with_name("gpu_scheduler.cel.yaml")
# `variables.<name>` in an expression.
_VARIABLE = re.compile(r"\bvariables\.([A-Za-z_][A-Za-z0-9_]*)\b")
# The prefix of the names inline() binds a variable to.
_BOUND = "v_"
# Where the file's `config` variable takes the parameter document.
_DOCUMENT = "$document"
DEVICE_CLASSES_KEY = "gpu_device_classes"
"""The parameter document's key for the DeviceClasses whose claims are GPU requests (DRA
mode); the CEL file reads it by this name."""
POOL_NODES_KEY = "pool_nodes"
"""The parameter document's key for the GPU pool's nodes."""
# The API server compiles no CEL expression of more than 100,000 code points ("expression code
# point size exceeds limit", measured on kube-apiserver v1.37.2): the pool's nodes, thousands of
# names, are written into variables of their own, each at most this long, beside `config`.
NODES_PER_VARIABLE_CHARS = 90_000
_POOL_NODES_VARIABLE = "poolNodes"


def literal(value: str | Sequence[str] | Mapping[str, Any]) -> str:
    """A string, list of strings or map with string keys as a CEL literal (JSON's are valid
    CEL)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True)
    return json.dumps(list(value))


@functools.cache
def _load() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CEL_FILE.read_text())
    return loaded


def variables(params: Mapping[str, str]) -> list[dict[str, str]]:
    """The variables both policies declare (each may use the ones before it), the parameter
    document `params` written in as `config`. In DRA mode (the document has device classes)
    gpuNames leaves resource claims to the claim policies."""
    nodes = params.get(POOL_NODES_KEY)
    written = {k: v for k, v in params.items() if k != POOL_NODES_KEY}
    declared = [
        {**v, "expression": v["expression"].replace(_DOCUMENT, literal(written))}
        for v in _load()["variables"]
    ]
    if not any(
        v["name"] == "config" and _DOCUMENT in v["expression"] for v in _load()["variables"]
    ):
        raise ValueError(f"{CEL_FILE.name}: the config variable must be {_DOCUMENT}")
    if nodes is not None:
        declared = _with_pool_nodes(declared, nodes)
    if claims_looked_up(params):
        return _replaced(declared, "gpuNames", _load()["claims"]["podGpuNames"])
    return declared


def _node_chunks(nodes: str) -> list[list[str]]:
    """The comma-separated `nodes`, in lists of at most NODES_PER_VARIABLE_CHARS as literals."""
    chunks: list[list[str]] = [[]]
    size = 0
    for name in nodes.split(","):
        cost = len(json.dumps(name)) + 2
        if chunks[-1] and size + cost > NODES_PER_VARIABLE_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(name)
        size += cost
    return chunks


def _with_pool_nodes(declared: list[dict[str, str]], nodes: str) -> list[dict[str, str]]:
    """`declared` with the pool's `nodes` (comma-separated, as the document holds them) in
    variables poolNodes0, poolNodes1... just before poolNodes, which adds them up."""
    chunks = _node_chunks(nodes) if nodes else []
    names = [f"{_POOL_NODES_VARIABLE}{i}" for i in range(len(chunks))]
    added = [{"name": n, "expression": literal(c)} for n, c in zip(names, chunks, strict=True)]
    total = " + ".join(f"variables.{n}" for n in names) or "[]"
    malformed = "true" if any(name == "" for names in chunks for name in names) else "false"
    found: list[dict[str, str]] = []
    for variable in declared:
        if variable["name"] == _POOL_NODES_VARIABLE:
            found.extend(added)
            variable = {**variable, "expression": total}
        elif variable["name"] == f"{_POOL_NODES_VARIABLE}Malformed":
            variable = {**variable, "expression": malformed}
        found.append(variable)
    if len(found) != len(declared) + len(added):
        raise ValueError(f"CEL variable {_POOL_NODES_VARIABLE} is not declared")
    return found


def document(spec_variables: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The parameter document a policy was rendered with (its `config` variable, and the pool's
    nodes in their variables)."""
    (config,) = [v["expression"] for v in spec_variables if v["name"] == "config"]
    found: dict[str, str] = json.loads(config)
    chunk = re.compile(rf"{_POOL_NODES_VARIABLE}[0-9]+")
    chunks = [json.loads(v["expression"]) for v in spec_variables if chunk.fullmatch(v["name"])]
    if chunks:
        found[POOL_NODES_KEY] = ",".join(name for names in chunks for name in names)
    return dict(sorted(found.items()))


def claims_looked_up(params: Mapping[str, str]) -> bool:
    """Whether the parameter document is DRA mode's (it names device classes)."""
    return bool(params.get(DEVICE_CLASSES_KEY))


# A validation's keys in the API; the file's own marks (`claims`) are not rendered.
_VALIDATION_FIELDS = ("expression", "messageExpression", "message", "reason")


def validations() -> list[dict[str, str]]:
    """The ValidatingAdmissionPolicy's validations, in the order the API server tries them."""
    return [{k: v[k] for k in v if k in _VALIDATION_FIELDS} for v in _load()["validations"]]


def routing_variables(params: Mapping[str, str]) -> list[dict[str, str]]:
    """The MutatingAdmissionPolicy's variables: variables() and its own."""
    return variables(params) + _routing_own()


def routing_conditions(params: Mapping[str, str]) -> list[dict[str, str]]:
    """The MutatingAdmissionPolicy's match conditions, the variables inlined: the API server
    refuses a policy whose match conditions name variables."""
    declared = routing_variables(params)
    return [
        {"name": c["name"], "expression": inline(c["expression"], declared)}
        for c in _load()["routing"]["matchConditions"]
    ]


def _routing_own() -> list[dict[str, str]]:
    return [dict(v) for v in _load()["routing"]["variables"]]


def _replaced(declared: list[dict[str, str]], name: str, expression: str) -> list[dict[str, str]]:
    """`declared` with the variable `name`'s expression replaced by `expression`."""
    if name not in {v["name"] for v in declared}:
        raise ValueError(f"CEL variable {name} is not declared")
    return [{**v, "expression": expression} if v["name"] == name else v for v in declared]


# --------------------------------------------------------------------------- claim policies

CLAIM_KINDS: tuple[str, ...] = ("ResourceClaimTemplate", "ResourceClaim")
"""The kinds (resource.k8s.io/v1) a pod's resource claims name, each judged by a policy pair."""


def _claim_kind(kind: str) -> dict[str, str]:
    kinds: dict[str, dict[str, str]] = _load()["claims"]["kinds"]
    if kind not in kinds:
        raise ValueError(f"claim kind {kind!r} is not one of {sorted(kinds)}")
    return kinds[kind]


def claim_variables(kind: str, params: Mapping[str, str]) -> list[dict[str, str]]:
    """The variables of the claim policy for `kind` (CLAIM_KINDS): `config` is the parameter
    document `params` written in (the policy's own `params` is the looked-up object), the
    claim variables come before gpuNames, and gpuNames is the pod's claims naming a GPU
    object of `kind`."""
    claims, fields = _load()["claims"], _claim_kind(kind)

    def filled(text: str) -> str:
        return text.replace("$reference", fields["reference"]).replace(
            "$claimSpec", fields["claimSpec"]
        )

    declared: list[dict[str, str]] = []
    for variable in variables(params):
        if variable["name"] == "gpuNames":
            declared.extend(
                {"name": v["name"], "expression": filled(v["expression"])}
                for v in claims["variables"]
            )
            variable = {"name": "gpuNames", "expression": claims["gpuNames"]}
        declared.append(variable)
    return declared


def claim_validations() -> list[dict[str, str]]:
    """The validations of a GPU pod (marked `claims: true`), which the claim policies run."""
    marked = [i for i, v in enumerate(_load()["validations"]) if v.get("claims")]
    every = validations()
    return [every[i] for i in marked]


def claim_conditions(kind: str, params: Mapping[str, str]) -> list[dict[str, str]]:
    """The claim ValidatingAdmissionPolicy's match conditions, the variables inlined."""
    declared = claim_variables(kind, params)
    return [
        {"name": c["name"], "expression": inline(c["expression"], declared)}
        for c in _load()["claims"]["matchConditions"]
    ]


def claim_routing_variables(kind: str, params: Mapping[str, str]) -> list[dict[str, str]]:
    """The claim MutatingAdmissionPolicy's variables: claim_variables() and routing's own."""
    return claim_variables(kind, params) + _routing_own()


def claim_routing_conditions(kind: str, params: Mapping[str, str]) -> list[dict[str, str]]:
    """The claim MutatingAdmissionPolicy's match conditions, the variables inlined: the pod
    names this object, which selects a GPU class, and is routed as a GPU pod is."""
    declared = claim_routing_variables(kind, params)
    return [
        {"name": c["name"], "expression": inline(c["expression"], declared)}
        for c in [*_load()["claims"]["matchConditions"], *_load()["claims"]["routingConditions"]]
    ]


def routing_mutations() -> list[str]:
    """The MutatingAdmissionPolicy's JSON patch expressions, in order."""
    return list(_load()["routing"]["mutations"])


def inline(expression: str, declared: Sequence[Mapping[str, str]]) -> str:
    """The boolean `expression` without variables: each `variables.<name>` of `declared` it
    needs (itself or through another) is bound once (_let()), in the order declared, so the
    text grows by each variable once however often it is used."""
    known = {v["name"]: v["expression"] for v in declared}

    def uses(text: str) -> list[str]:
        names = _VARIABLE.findall(text)
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"CEL variables {unknown} are not declared; declared: {sorted(known)}")
        return names

    needed: set[str] = set()
    pending = uses(expression)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(uses(known[name]))

    def local(text: str) -> str:
        return _VARIABLE.sub(lambda m: f"{_BOUND}{m[1]}", text)

    body = local(expression)
    for variable in reversed([v for v in declared if v["name"] in needed]):
        body = _let(f"{_BOUND}{variable['name']}", local(variable["expression"]), body)
    return body


def _let(name: str, value: str, condition: str) -> str:
    """The boolean `condition` with `name` bound to `value`: a one-item exists(), as
    match conditions of a webhook have no cel.bind."""
    return f"[{value}].exists({name}, {condition})"


def webhook_conditions(params: Mapping[str, str]) -> list[dict[str, str]]:
    """The webhook's match conditions: the file's, with the variables inlined (a webhook has
    none), the parameter document `params` written in."""
    return [
        {"name": c["name"], "expression": inline(c["expression"], variables(params))}
        for c in _load()["webhook"]["matchConditions"]
    ]


# --------------------------------------------------------------------------- allocations


def allocation_variables(
    *, allocator: str, scheduler_name: str, drivers: Sequence[str]
) -> list[dict[str, str]]:
    """The allocation policy's variables (DRA mode): the file's, after the values it marks
    `written`, written in: `allocator` (the username of the one identity that may allocate a
    GPU device), `scheduler_name` (named in the refusal) and the GPU `drivers`."""
    section = _load()["allocations"]
    written = {"allocator": allocator, "schedulerName": scheduler_name, "drivers": list(drivers)}
    if sorted(written) != sorted(section["written"]):
        raise ValueError(f"allocation policy values {sorted(section['written'])} are written in")
    return [
        *({"name": name, "expression": literal(written[name])} for name in section["written"]),
        *(dict(v) for v in section["variables"]),
    ]


def allocation_validations() -> list[dict[str, str]]:
    """The allocation policy's validations."""
    return [
        {k: v[k] for k in v if k in _VALIDATION_FIELDS}
        for v in _load()["allocations"]["validations"]
    ]
