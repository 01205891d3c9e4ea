"""What every layer's settings model shares: the base model, value rules and the one error format.

A layer's settings model is its section of the stack config and the data part of its Args
(the Args subclass adds runtime inputs such as the cluster access and other layers' outputs).
Models are strict where it matters (every scalar goes through a `Rule`, so `"4"` is not 4 and
`1` is not `true`), reject unknown keys, and read camelCase keys.

A `Rule` is one constraint written once: its `allowed` text is both the error message and the
line in docs/config-reference.md. `format_problems` turns a pydantic ValidationError into
`gpu-cluster:<key path>: got <value as written>; <what is allowed>`, every problem at once,
never printing a secret's value nor the value of an unknown key.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import pulumi
from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

if TYPE_CHECKING:
    from components.charts import HelmChart

PROJECT = "gpu-cluster"
ERROR_TYPE = "gpu_cluster"
SECRET_SHOWN = "[secret, not shown]"
PLAIN_TEXT_SHOWN = "[plain text, not shown]"


# --------------------------------------------------------------------------- rules


def problem(allowed: str, *, at: str = "", value: Any = None, key: str = "") -> PydanticCustomError:
    """An error in this project's format.

    `at` extends the key path of the value being validated (e.g. "[2].utilization"), `key`
    replaces it with an absolute key (e.g. "grafanaAdminPassword"), `value` replaces the value
    shown.
    """
    ctx: dict[str, Any] = {"allowed": allowed}
    if at:
        ctx["at"] = at
    if key:
        ctx["key"] = key
    if value is not None:
        ctx["value"] = value
    return PydanticCustomError(ERROR_TYPE, "{allowed}", ctx)


@dataclass(frozen=True)
class Rule:
    """A value rule, used as `Annotated[T, Rule(...)]`: the whole validation of that value.

    `check` says whether a value is allowed; `convert` (optional) turns an allowed value into
    the stored one. `allowed` is the error text and the docs' description of the rule.
    """

    allowed: str
    check: Callable[[Any], bool]
    convert: Callable[[Any], Any] | None = None

    def validate(self, value: Any) -> Any:
        if not self.check(value):
            raise problem(self.allowed)
        return self.convert(value) if self.convert else value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)


@dataclass(frozen=True)
class Runtime:
    """Marks an Args field that is a runtime input (a cluster access, another layer's output):
    passed through unvalidated and left out of the config reference."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.any_schema()


@dataclass(frozen=True, kw_only=True)
class Layer:
    """Marks a stack config field as a layer's section. The fields so marked, in their order,
    are the one table of layers (stack_config.LAYERS): the stack's sections, the
    one-namespace-per-layer rule, what a refusal of a layer's object names, the config
    reference and README's table of layers derive from it (docs/adding-a-layer.md)."""

    component: str
    """The layer's ComponentResource class, as components/__init__.py exports it."""
    summary: str
    """What the layer does, in one line (README's table of layers)."""
    namespace: str | None = None
    """The field of its settings naming the namespace the layer creates, if it has one; the
    settings then also have `createNamespace` (false: use an existing one)."""
    fixed_namespace: str | None = None
    """The namespace the layer creates that is no setting."""
    chart: HelmChart | None = None
    """The Helm chart the layer installs (its settings module's CHART), if it installs one."""


class ContextRule:
    """Base of value rules that read the validation context (the inventory, the secret keys):
    subclasses define `validate(value, info)`."""

    def validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        raise NotImplementedError

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(self.validate)


def is_str(value: Any) -> bool:
    return isinstance(value, str)


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(check: Callable[[str], bool], allowed: str) -> Rule:
    """A string that `check` accepts."""
    return Rule(allowed, lambda v: isinstance(v, str) and check(v))


def between(low: int, high: int, allowed: str = "") -> Rule:
    """An integer from `low` to `high` (YAML int, not bool, float or string)."""
    return Rule(
        allowed or f"expected an integer from {low} to {high}",
        lambda v: is_int(v) and low <= v <= high,
    )


def choice(values: Sequence[str]) -> Rule:
    return Rule(f"allowed: {', '.join(values)}", lambda v: isinstance(v, str) and v in values)


STRING = Rule("expected a string", is_str)
BOOL = Rule("expected true or false", is_bool)


def unique(allowed: str) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """An AfterValidator for lists: each item at most once (the second one is reported)."""

    def check(items: Sequence[Any]) -> Sequence[Any]:
        seen: set[Any] = set()
        for i, item in enumerate(items):
            if item in seen:
                raise problem(allowed, at=f"[{i}]", value=item)
            seen.add(item)
        return items

    return check


# --------------------------------------------------------------------------- models


class Settings(BaseModel):
    """Base of every settings model: frozen, unknown keys refused, camelCase keys."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        arbitrary_types_allowed=True,
        hide_input_in_errors=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """A key written without a value (YAML null) takes its default, like an absent key."""
        if isinstance(data, Mapping):
            runtime = {
                key
                for name, info in cls.model_fields.items()
                if any(isinstance(m, Runtime) for m in info.metadata)
                for key in (name, info.alias)
            }
            return {k: v for k, v in data.items() if v is not None or k in runtime}
        return data

    @classmethod
    def from_settings(cls, settings: Any, **inputs: Any) -> Self:
        """This Args class from a settings object of its base class plus the runtime inputs."""
        base = cls.__mro__[1]
        if not (isinstance(settings, Settings) and isinstance(settings, base)):
            raise TypeError(f"{cls.__name__} takes {base.__name__}, got {settings!r}")
        fields = {name: getattr(settings, name) for name in type(settings).model_fields}
        return cls.model_validate({**fields, **inputs})


def config_keys(model: type[BaseModel]) -> list[str]:
    """The camelCase keys of a settings model, in declaration order (runtime inputs left out)."""
    return [
        info.alias or name
        for name, info in model.model_fields.items()
        if not any(isinstance(m, Runtime) for m in info.metadata)
    ]


# --------------------------------------------------------------------------- problems


class _NotShown:
    def __repr__(self) -> str:
        return "<not shown>"


NOT_SHOWN = _NotShown()
"""A Problem's value when it is not to be shown (a secret, or missing)."""


@dataclass(frozen=True)
class Problem:
    """One invalid config value."""

    key: str
    value: Any
    allowed: str
    namespace: str = PROJECT
    """The key's config namespace (another only for a key outside the project's)."""

    def __str__(self) -> str:
        if self.value is NOT_SHOWN:
            return f"{self.namespace}:{self.key}: {self.allowed}"
        return f"{self.namespace}:{self.key}: got {self.value!r}; {self.allowed}"


class ConfigError(pulumi.RunError, ValueError):
    """Raised with every problem found in the stack config (shown without a stack trace)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack config ({len(self.problems)} problem(s)):\n{lines}")


# Pydantic's own error types that can reach a user, in this project's words.
_BUILTIN_MESSAGES = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dataclass_type": "expected an object",
    "dict_type": "expected an object",
    "mapping_type": "expected an object",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "iterable_type": "expected a list",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
}


def _key_path(loc: Iterable[int | str]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for "the dict key itself failed"
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model that the key path `loc` points into, or None."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            if not isinstance(part, str):
                return None
            by_alias = {(i.alias or n): i for n, i in current.model_fields.items()}
            info = by_alias.get(part) or current.model_fields.get(part)
            if info is None:
                return None
            current = info.annotation
        else:
            current = _element_type(current)
            if current is None:
                return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """`X` for `X | None` and `Annotated[X, ...]`, else `annotation`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _element_type(annotation: Any) -> Any:
    """The item type of a list/tuple/dict annotation (value type for dicts)."""
    args = getattr(annotation, "__args__", None)
    if not args:
        return None
    origin = getattr(annotation, "__origin__", None)
    if origin in (dict, Mapping):
        return args[-1]
    return args[0]


def format_problems(
    error: ValidationError,
    root: type[BaseModel],
    *,
    hidden: Collection[str] = (),
    prefix: Sequence[str | int] = (),
) -> list[Problem]:
    """Every error of `error` as a Problem, in the order pydantic found them.

    `hidden`: top-level keys whose values are never shown (secrets). Unknown keys are named
    with the keys allowed there, never with their value.
    """
    problems: list[Problem] = []
    for err in error.errors():
        loc = (*prefix, *err["loc"])
        ctx = err.get("ctx") or {}
        value: Any = ctx.get("value", err["input"])
        if err["type"] == ERROR_TYPE:
            allowed = str(ctx["allowed"])
            key = str(ctx["key"]) if "key" in ctx else _key_path(loc) + str(ctx.get("at", ""))
        elif err["type"] == "missing":
            # The input of a missing key is its parent object, which may hold mistyped keys.
            allowed, key, value = "required", _key_path(loc), NOT_SHOWN
        elif err["type"] == "extra_forbidden":
            parent = _model_at(root, loc[len(prefix) : -1]) if len(loc) > len(prefix) else None
            keys = config_keys(parent) if parent else []
            allowed = f"unknown key; allowed: {', '.join(keys)}"
            key, value = _key_path(loc), NOT_SHOWN
        else:
            allowed = _BUILTIN_MESSAGES.get(err["type"], err["msg"])
            key = _key_path(loc)
        top = key.split(".", 1)[0].split("[", 1)[0]
        if top in hidden and value is not NOT_SHOWN and value not in ("", PLAIN_TEXT_SHOWN):
            value = SECRET_SHOWN
        problems.append(Problem(key, value, allowed))
    return problems


def context_value(info: Any, name: str) -> Any:
    """`name` from a validator's context, or None when validated without one."""
    context = getattr(info, "context", None) or {}
    return context.get(name)
