"""Loads gpu_scheduler.cel.yaml, the static CEL of the native engines (beside the Rego it mirrors).

The rules are written once, in policies/gpu_scheduler.cel.yaml, and read the gate's
configuration from the parameter document (`params`); nothing here writes configuration into
CEL, except for the webhook, which has neither params nor variables: webhook_conditions()
inlines the variables and puts the parameter document in place of `params`, once, from the
same text. components/opa_gate/manifests.py wraps these pieces into the objects.
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


def variables() -> list[dict[str, str]]:
    """The variables both policies declare (each may use the ones before it)."""
    return [dict(v) for v in _load()["variables"]]


def validations() -> list[dict[str, str]]:
    """The ValidatingAdmissionPolicy's validations, in the order the API server tries them."""
    return [dict(v) for v in _load()["validations"]]


def routing_variables() -> list[dict[str, str]]:
    """The MutatingAdmissionPolicy's variables: variables() and its own."""
    return variables() + [dict(v) for v in _load()["routing"]["variables"]]


def routing_conditions() -> list[dict[str, str]]:
    """The MutatingAdmissionPolicy's match conditions, the variables inlined: the API server
    refuses a policy whose match conditions name variables (they may read `params`)."""
    return [
        {"name": c["name"], "expression": inline(c["expression"], routing_variables())}
        for c in _load()["routing"]["matchConditions"]
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


def with_params(expression: str, params: Mapping[str, str]) -> str:
    """`expression` with `params` bound to a ConfigMap-shaped literal holding `params` as its
    data (written once)."""
    return _let("params", f"dyn({{'data': {literal(params)}}})", expression)


def webhook_conditions(params: Mapping[str, str]) -> list[dict[str, str]]:
    """The webhook's match conditions: the file's, with the variables inlined and `params`
    replaced by the parameter document `params` (a webhook has neither)."""
    return [
        {"name": c["name"], "expression": with_params(inline(c["expression"], variables()), params)}
        for c in _load()["webhook"]["matchConditions"]
    ]
