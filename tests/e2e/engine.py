"""Run __main__.py for a named stack against the local cluster, the way `pulumi up` would.

The Pulumi engine cannot run the whole program here: the kubernetes, command and tls provider
plugins and the Python language host are not available (tools/README.md). This harness takes
the engine's place and nothing else. The program runs under the Python SDK's own runtime with
a mock monitor; every resource it registers goes to a stand-in for its provider
(tests/e2e/providers.py) that does on this cluster what that provider does:

- ``kubernetes:*`` objects are server-side applied and awaited as pulumi-kubernetes awaits them;
- ``pulumi-python:dynamic/*`` resources run the program's own dynamic providers;
- ``tls:*`` keys and certificates are generated locally;
- ``command:remote:*`` commands are recorded (no SSH hosts here);
- Helm releases are recorded with their values (no chart can be had here).

Order is the engine's: the SDK registers a resource only once the outputs and URNs of what it
depends on have resolved, and a stand-in returns only when its resource is done (applied and
ready), so nothing is applied before its dependencies. A second `up` diffs each resource
against the state of the first (a resource with no change is not touched, as in the engine),
and `destroy` deletes in the reverse order of completion, waiting for each deletion.

None of this is a product feature: it exists so that the scenario tests (tests/e2e) and
`make demo` can run the whole program on a real API server.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pulumi
import yaml
from pulumi.runtime import rpc, settings
from pulumi.runtime.mocks import MockMonitor

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "gpu-cluster"
# Resources registered at once; enough that no wait ever blocks another resource.
PARALLEL = 256


@dataclass
class Resource:
    """One resource as the engine's state holds it."""

    key: str
    """`<type>::<name>`: unique in a stack, like the URN it stands for."""
    typ: str
    name: str
    provider: str
    """The provider reference `urn::id` ("" where the default provider would be used)."""
    inputs: dict[str, Any]
    id: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What one run did to one resource: create, update, same (no change) or delete."""

    op: str
    key: str
    detail: str = ""


class Provider(Protocol):
    """A stand-in for one provider plugin."""

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        """Create `res`; return its id and outputs once it is ready."""
        ...

    def diff(self, old: Resource, new: Resource) -> list[str]:
        """What would change (property paths); empty when nothing would."""
        ...

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        """Update to `new`; return the new outputs once ready."""
        ...

    def delete(self, res: Resource) -> None:
        """Delete and wait until it is gone."""
        ...


class StackError(RuntimeError):
    """The program, or a provider stand-in, failed; the message says which resource."""


def reveal(value: Any) -> Any:
    """`value` with the SDK's secret wrappers removed (a provider receives plain values)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return reveal(value.get("value"))
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v) for v in value]
    return value


def stack_config(stack: str, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Pulumi.yaml's defaults, Pulumi.<stack>.yaml and `overrides`, as the CLI hands them over.

    Objects are JSON strings, as the CLI passes structured config to the program.
    """
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    values: dict[str, Any] = {
        f"{PROJECT}:{key}": spec.get("default") for key, spec in project["config"].items()
    }
    document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    values.update(document.get("config") or {})
    for key, value in (overrides or {}).items():
        values[f"{PROJECT}:{key}"] = value
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


class _EngineMocks(pulumi.runtime.Mocks):
    """The SDK's mock hooks, each custom resource handed to the engine stand-in."""

    def __init__(self, engine: StackEngine) -> None:
        self._engine = engine

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        if not args.custom:  # a component: a grouping, nothing to create
            return f"{args.name}-id", dict(args.inputs)
        res = Resource(
            key=f"{args.typ}::{args.name}",
            typ=args.typ,
            name=args.name,
            provider=args.provider or "",
            inputs=dict(args.inputs),
        )
        self._engine.register(res)
        return res.id, res.outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        raise StackError(f"the program invoked {args.token}, which this harness does not provide")


class _EngineMonitor(MockMonitor):
    """The SDK's mock monitor, also noting what each registration said it depends on."""

    def __init__(self, mocks: _EngineMocks, engine: StackEngine) -> None:
        super().__init__(mocks)
        self._engine = engine

    def RegisterResource(self, request: Any) -> Any:
        key = f"{request.type}::{request.name}"
        urns = set(request.dependencies)
        for deps in request.propertyDependencies.values():
            urns.update(deps.urns)
        response = super().RegisterResource(request)
        self._engine.note_registration(response.urn, key, urns)
        return response


class StackEngine:
    """The engine's part for one stack: run the program, keep state, destroy in reverse order."""

    def __init__(
        self,
        stack: str,
        providers: Callable[[str], Provider],
        *,
        overrides: Mapping[str, Any] | None = None,
        secret_keys: Iterator[str] | tuple[str, ...] = (),
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.stack = stack
        self.overrides = dict(overrides or {})
        self.secret_keys = tuple(secret_keys)
        self._providers = providers
        self._log = log
        self.state: dict[str, Resource] = {}
        self.order: list[str] = []
        """URNs in the order their create finished: destroy walks it backwards."""
        self.steps: list[Step] = []
        self.outputs: dict[str, Any] = {}
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}
        self._dependency_urns: dict[str, set[str]] = {}

    # ---------------------------------------------------------------- running
    def up(self) -> list[Step]:
        """Run the program once; returns the steps of this run (creates, updates, sames)."""
        self.steps = []
        self._seen = set()
        config = stack_config(self.stack, self.overrides)
        settings.ROOT.set(None)
        pulumi.runtime.set_all_config(config, [f"{PROJECT}:{key}" for key in self.secret_keys])
        mocks = _EngineMocks(self)
        pulumi.runtime.set_mocks(
            mocks,
            project=PROJECT,
            stack=self.stack,
            preview=False,
            monitor=_EngineMonitor(mocks, self),
        )
        outputs: dict[str, Any] = {}

        @pulumi.runtime.test
        def run() -> pulumi.Output[Any]:
            # Registrations run on the loop's default executor, where each one blocks until
            # its resource is ready. The engine has no such cap (its --parallel default is
            # unbounded), so neither may the harness: a Service awaiting endpoints must not
            # hold up the Deployment that provides them.
            asyncio.get_event_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="register")
            )
            runpy.run_path(str(REPO_ROOT / "__main__.py"), run_name="__main__")
            root = settings.get_root_resource()
            exports = dict(getattr(root, "outputs", {}))
            return pulumi.Output.from_input(exports).apply(outputs.update)

        try:
            run()
        except Exception as exc:
            raise StackError(f"pulumi up ({self.stack}) failed: {exc}") from exc
        self.outputs = reveal(outputs)
        stale = [key for key in reversed(self.order) if key not in self._seen]
        for key in stale:  # resources the program no longer declares are deleted, as up does
            self._delete(key)
        return list(self.steps)

    def register(self, res: Resource) -> None:
        """A registration from the program: create, update or leave it, then record outputs."""
        provider = self._providers(res.typ)
        old = self.state.get(res.key)
        if old is None:
            self._log(f"+ create {res.typ} {res.name}")
            try:
                res.id, res.outputs = provider.create(res)
            except Exception as exc:
                raise StackError(f"create {res.typ} {res.name}: {exc}") from exc
            step = Step("create", res.key)
        else:
            changes = provider.diff(old, res)
            res.id = old.id
            if changes:
                self._log(f"~ update {res.typ} {res.name}: {', '.join(changes)}")
                try:
                    res.outputs = provider.update(old, res)
                except Exception as exc:
                    raise StackError(f"update {res.typ} {res.name}: {exc}") from exc
                step = Step("update", res.key, ", ".join(changes))
            else:
                res.outputs = old.outputs
                step = Step("same", res.key)
        with self._lock:
            if res.key not in self.state:
                self.order.append(res.key)
            self.state[res.key] = res
            self._seen.add(res.key)
            self.steps.append(step)

    # ---------------------------------------------------------------- destroy
    def destroy(self) -> list[Step]:
        """Delete every resource, dependents first, waiting for each to be gone."""
        self.steps = []
        for key in reversed(list(self.order)):
            self._delete(key)
        return list(self.steps)

    def _delete(self, key: str) -> None:
        res = self.state[key]
        self._log(f"- delete {res.typ} {res.name}")
        try:
            self._providers(res.typ).delete(res)
        except Exception as exc:
            raise StackError(f"delete {res.typ} {res.name}: {exc}") from exc
        del self.state[key]
        self.order.remove(key)
        self.steps.append(Step("delete", key))

    def note_registration(self, urn: str, key: str, dependency_urns: set[str]) -> None:
        with self._lock:
            self._keys[urn] = key
            self._dependency_urns[key] = dependency_urns

    # ---------------------------------------------------------------- queries
    @property
    def dependencies(self) -> dict[str, list[str]]:
        """Resource -> the resources (in state) it was registered as depending on.

        Dependencies on a component stand for its children, which the SDK lists itself.
        """
        found = {}
        for key, urns in self._dependency_urns.items():
            if key in self.state:
                keys = {self._keys[u] for u in urns if u in self._keys}
                found[key] = sorted(k for k in keys if k in self.state)
        return found

    def of_prefix(self, prefix: str) -> list[Resource]:
        """Resources whose type starts with `prefix`, in the order they were created."""
        return [self.state[key] for key in self.order if self.state[key].typ.startswith(prefix)]

    def of_type(self, typ: str) -> list[Resource]:
        return [self.state[key] for key in self.order if self.state[key].typ == typ]

    def changed(self) -> list[Step]:
        """The steps of the last run that changed something."""
        return [s for s in self.steps if s.op != "same"]
