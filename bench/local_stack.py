"""The whole program under the real Pulumi engine on the local cluster, against its floors.

Measures, in one run:

1. the kubernetes provider plugin's build (`tools/build-pulumi.sh pulumi-resource-kubernetes`):
   cold, as the build logs given with `--build-log` say (`built <tool> in <n> s`); warm, the
   script again with the plugin up to date; and a relink, the script building a fresh binary
   into an empty folder (GPU_CLUSTER_TOOLS_BIN) from the warm Go build cache. Both warm runs
   set GOPROXY=off, so nothing is fetched;
2. the local cluster's start (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
   kwok) until the stack's nodes are Ready, then the README's prerequisites and the stack's
   creation (tools/harness/stack.py: AppliedStack);
3. an empty program's `up` and its no-op `up` under the same engine, CLI and Automation API
   (tools/harness/pulumi_engine.py: inline_stack): the engine's own start-up;
4. the stack's `up`, no-op `up`, `preview`, `refresh` and `destroy` of the whole program
   (__main__.py, as ProjectStack runs it), with the resources in the state and the engine's
   change summary;
5. the floor, on the same cluster after the stack's `destroy`: one plain client (the
   kubernetes package's dynamic client) doing what the stack's `up` did to the cluster. It
   server-side-applies the objects of the stack's state after `up` (each kubernetes
   resource's inputs, secrets revealed; for a Helm release, the CRDs in its chart and what
   the chart rendered, the `<release>-values` ConfigMap) in the state's order, waits for
   what the provider waits for (Deployments available, Services with a ready endpoint,
   CRDs Established) before it applies anything that depends on the object, and makes
   the node layers' writes (per node, one metadata/spec patch and one status patch: the
   difference between the nodes before and after `up`). Its teardown deletes the objects
   in reverse order (foreground, as the provider deletes) and waits for an object to be gone
   before it deletes anything the object depends on, leaves the chart's CRDs as Helm does,
   and undoes the node writes. The charts' CRDs are deleted before the floor (untimed), so
   it starts from the cluster the stack started from. What is not the Kubernetes API (the
   TLS and command stand-ins, Helm's release record) is left out of the floor.

Ratios: `up` / floor up, `destroy` / floor teardown, no-op `up` / the empty program's `up`.
Goals: `up` within 2x the floor; a no-op `up` within 2x the empty program's `up`. After the
table, where each engine run's time went, from its events as they arrived: the start-up
until the first resource step, the resource steps, the engine's end after the last one, the
Automation API's reads after the engine's summary, and the slowest resource steps.

    .venv/bin/python -m bench.local_stack
    .venv/bin/python -m bench.local_stack --build-log /tmp/logs/build-k8s-provider.log
    .venv/bin/python -m bench.local_stack --stack dev --csv /tmp/dev.csv   # another stack's shape
    .venv/bin/python -m bench.local_stack --no-build      # without the warm builds
    .venv/bin/python -m bench.local_stack --steps         # every resource step, not the slowest

The rows go to `DEFAULT_CSV` (the whole-program study) unless `--csv` names another file.
A step that fails is a row saying why, the steps that need it are skipped, and the exit
status is 1. It is a script, not a test: the seconds depend on the machine (2 shared cores
here; each row records the load average), so compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from pulumi import automation as auto

from bench import WHOLE_PROGRAM, write_rows
from bench.floor import Floor, FloorUnit, NodeWrite, floor_units, node_writes, read_releases
from tools.harness.cluster import LocalCluster
from tools.harness.fake_nodes import FakeNode
from tools.harness.pulumi_engine import PROJECT, inline_stack
from tools.harness.stack import ADMISSION_PLUGINS, AppliedStack

REPO_ROOT = Path(__file__).resolve().parents[1]

DEFAULT_CSV = WHOLE_PROGRAM / "local_stack.csv"
PROVIDER_PLUGIN = "pulumi-resource-kubernetes"
BUILT = re.compile(r"^built (\S+) in (\d+) s$", re.MULTILINE)

T = TypeVar("T")


# ------------------------------------------------------------------------------- rows, goals


@dataclass
class Row:
    step: str
    seconds: float | None
    resources: int | None = None
    """Resources in the stack's state (objects and nodes for the floor)."""
    changes: str = ""
    ratio: float | None = None
    against: str = ""
    load: float | None = None
    """The machine's 1-minute load average at the end of the step."""
    note: str = ""


@dataclass(frozen=True)
class Goal:
    text: str
    step: str
    against: str
    within: float


UP = "up"
NOOP_UP = "no-op up"
DESTROY = "destroy"
EMPTY_UP = "empty program: up"
FLOOR_UP = "floor: apply"
FLOOR_TEARDOWN = "floor: teardown"

# (step, the step it is compared with)
RATIOS = ((UP, FLOOR_UP), (DESTROY, FLOOR_TEARDOWN), (NOOP_UP, EMPTY_UP))
GOALS = (
    Goal("`up` within 2x the floor", UP, FLOOR_UP, 2.0),
    Goal("no-op `up` within 2x the empty program's `up`", NOOP_UP, EMPTY_UP, 2.0),
)


def add_ratios(rows: Sequence[Row]) -> None:
    """Fill in each compared row's ratio to its reference, where both were measured."""
    seconds = {row.step: row.seconds for row in rows}
    for row in rows:
        for step, against in RATIOS:
            reference = seconds.get(against)
            if row.step == step and row.seconds is not None and reference:
                row.ratio = round(row.seconds / reference, 2)
                row.against = against


def verdicts(rows: Sequence[Row]) -> list[str]:
    """One line per goal: PASS or MISS with the ratio, or why it could not be judged."""
    by_step = {row.step: row for row in rows}
    lines = []
    for goal in GOALS:
        row = by_step.get(goal.step)
        if row is None or row.ratio is None or row.against != goal.against:
            lines.append(f"{goal.text:<48} not judged ({goal.step} or {goal.against} missing)")
            continue
        verdict = "PASS" if row.ratio <= goal.within else "MISS"
        lines.append(f"{goal.text:<48} {verdict} ({row.ratio:.2f}x)")
    return lines


# ------------------------------------------------------------------------------ the builds


def cold_builds(text: str) -> dict[str, int]:
    """`built <tool> in <n> s` lines of a build log: seconds per tool (the last line wins)."""
    return {tool: int(seconds) for tool, seconds in BUILT.findall(text)}


def failure_reason(exc: BaseException) -> str:
    """One line for the table: the CLI's first `error:` line, else the message's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    reason = (errors or lines or [type(exc).__name__])[0 if errors else -1]
    return f"{type(exc).__name__}: {reason}"[:200]


# ------------------------------------------------------------------------- the engine's events


def _custom(step: auto.events.StepEventMetadata) -> bool:
    """A step of a custom resource (a provider's), not of a component or the stack."""
    state = step.new or step.old
    return state is not None and bool(state.custom)


@dataclass
class Timeline:
    """When each custom resource's step of one engine run began and ended, as its events arrived."""

    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    summary: float | None = None
    """When the engine's summary event arrived: the CLI's run is over."""
    begun: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)

    def record(self, event: auto.events.EngineEvent) -> None:
        now = time.monotonic()
        if event.summary_event is not None:
            self.summary = now
        pre = event.resource_pre_event
        if pre is not None and _custom(pre.metadata):
            self.begun.setdefault(pre.metadata.urn, now)
            self.ops[pre.metadata.urn] = pre.metadata.op.value
        for end in (event.res_outputs_event, event.res_op_failed_event):
            if end is not None and _custom(end.metadata):
                self.finished[end.metadata.urn] = now

    def phases(self) -> dict[str, float | None]:
        """Seconds of: start-up to the first step, the steps, the engine's end, what follows."""
        end = self.ended or time.monotonic()
        summary = self.summary or end
        first = min(self.begun.values(), default=None)
        last = max(self.finished.values(), default=None)
        return {
            "total": end - self.started,
            "start-up": (first or summary) - self.started,
            "resource steps": last - first if first is not None and last is not None else None,
            "engine's end": summary - last if last is not None else None,
            "after the summary": end - summary,
        }

    def steps(self) -> list[tuple[float, float, str]]:
        """Each resource step as (began, ended) seconds after the run's start, "op type name"."""
        return sorted(
            (
                begun - self.started,
                self.finished[urn] - self.started,
                f"{self.ops[urn]} {urn.split('::')[-2]} {urn.split('::')[-1]}",
            )
            for urn, begun in self.begun.items()
            if urn in self.finished
        )

    def slowest(self, count: int = 6) -> list[tuple[float, str]]:
        """The longest resource steps: (seconds, "op type name")."""
        steps = [(ended - began, what) for began, ended, what in self.steps()]
        return sorted(steps, reverse=True)[:count]


def change_summary(changes: Mapping[Any, int] | None) -> str:
    return ", ".join(
        f"{getattr(op, 'value', op)} {n}" for op, n in sorted((changes or {}).items(), key=str) if n
    )


def engine_run(stack: auto.Stack, operation: str, timeline: Timeline) -> str:
    """`pulumi <operation>` of `stack` with its events timed; the engine's change summary."""
    record = timeline.record
    changes: Mapping[Any, int] | None
    if operation == "up":
        changes = stack.up(on_event=record).summary.resource_changes
    elif operation == "preview":
        changes = stack.preview(diff=True, on_event=record).change_summary
    elif operation == "refresh":
        changes = stack.refresh(on_event=record).summary.resource_changes
    elif operation == "destroy":
        changes = stack.destroy(on_event=record).summary.resource_changes
    else:
        raise ValueError(f"unknown operation {operation}")
    timeline.ended = time.monotonic()
    return change_summary(changes)


# ---------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Detail:
    """What a timed step reports besides its seconds."""

    resources: int | None = None
    changes: str = ""
    note: str = ""


class Run:
    """The rows of one run; a step that fails becomes a row saying why."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.rows: list[Row] = []
        self.timelines: dict[str, Timeline] = {}
        self.failed = False

    def fail(self, step: str, exc: Exception, seconds: float | None = None) -> None:
        """A row saying why `step` failed; the whole message goes to the log."""
        after = f" after {seconds:.1f} s" if seconds is not None else ""
        self.rows.append(Row(step, None, note=f"FAILED{after}: {failure_reason(exc)}"))
        tail = "\n".join(str(exc).splitlines()[-40:])
        self.log(f"{step} FAILED{after}:\n{tail}")
        self.failed = True

    def timed(self, step: str, action: Callable[[], Detail]) -> Row | None:
        """The step's row, or None when it failed."""
        self.log(f"{step} ...")
        started = time.monotonic()
        try:
            detail = action()
        except Exception as exc:
            self.fail(step, exc, time.monotonic() - started)
            return None
        seconds = time.monotonic() - started
        row = Row(
            step,
            round(seconds, 2),
            detail.resources,
            detail.changes,
            load=round(os.getloadavg()[0], 1),
            note=detail.note,
        )
        self.rows.append(row)
        self.log(f"{step}: {seconds:.1f} s {detail.changes}")
        return row

    def attempt(self, step: str, action: Callable[[], T]) -> T | None:
        """An untimed step (reading state, preparing the cluster); None when it failed."""
        try:
            return action()
        except Exception as exc:
            self.fail(step, exc)
            return None

    def skip(self, steps: Iterable[str], why: str) -> None:
        self.rows.extend(Row(step, None, note=f"skipped: {why}") for step in steps)

    def engine(
        self, step: str, stack: auto.Stack, operation: str, count: Callable[[], int] | None = None
    ) -> Row | None:
        """`pulumi <operation>`, timed with its events; `count` (untimed) gives the resources.
        The step's row, or None when it failed."""
        timeline = Timeline()
        self.timelines[step] = timeline

        def action() -> Detail:
            timeline.started = time.monotonic()
            return Detail(changes=engine_run(stack, operation, timeline))

        row = self.timed(step, action)
        if row is not None and count is not None:
            row.resources = self.attempt(f"count the resources after {step}", count)
        return row


class _TimedCluster(LocalCluster):
    """The local cluster, noting when the nodes AppliedStack.start() adds are Ready."""

    nodes_ready: float | None = None

    def add_nodes(self, nodes: Iterable[FakeNode], timeout: float = 90.0) -> list[str]:
        names = super().add_nodes(nodes, timeout)
        self.nodes_ready = time.monotonic()
        return names


def build_provider(run: Run, logs: Sequence[Path], build: bool) -> None:
    cold = {
        tool: (seconds, log)
        for log in logs
        for tool, seconds in cold_builds(log.read_text()).items()
    }
    step = "provider build: cold (build log)"
    if PROVIDER_PLUGIN in cold:
        seconds, log = cold[PROVIDER_PLUGIN]
        run.rows.append(Row(step, float(seconds), note=str(log)))
    elif logs:
        run.skip([step], f"no `built {PROVIDER_PLUGIN} in <n> s` line in the logs")
    if not build:
        return
    script = [str(REPO_ROOT / "tools" / "build-pulumi.sh"), PROVIDER_PLUGIN]
    offline = {**os.environ, "GOPROXY": "off"}

    def run_script(env: Mapping[str, str]) -> Detail:
        done = subprocess.run(
            ["bash", *script], env=dict(env), capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(script)} exited {done.returncode}:\n{done.stderr}")
        lines = done.stdout.strip().splitlines()
        return Detail(note=next((line for line in lines if PROVIDER_PLUGIN in line), ""))

    run.timed("provider build: warm (up to date)", lambda: run_script(offline))
    with tempfile.TemporaryDirectory(prefix="bench-provider-") as tmp:
        run.timed(
            "provider build: relink (warm Go cache)",
            lambda: run_script({**offline, "GPU_CLUSTER_TOOLS_BIN": tmp}),
        )


@dataclass(frozen=True)
class AfterUp:
    """What the stack's `up` left, as the floor redoes it."""

    units: list[FloorUnit]
    writes: list[NodeWrite]
    undo: list[NodeWrite]


def after_up(applied: AppliedStack) -> AfterUp:
    """The state, what the Helm releases rendered and the nodes, read after `up`."""
    resources = applied.engine.resources()
    units = floor_units(resources, read_releases(applied.api_client(), resources))
    writes, undo = node_writes(applied.nodes_before, applied.node_state())
    return AfterUp(units, writes, undo)


EMPTY_STEPS = (EMPTY_UP, "empty program: no-op up")
STACK_STEPS = (UP, NOOP_UP, "preview", "refresh", DESTROY)
FLOOR_STEPS = (FLOOR_UP, FLOOR_TEARDOWN)


def measure(stack: str, logs: Sequence[Path], build: bool, log: Callable[[str], None]) -> Run:
    run = Run(log)
    build_provider(run, logs, build)
    with tempfile.TemporaryDirectory(prefix="bench-local-stack-") as tmp:
        workdir = Path(tmp)
        applied = AppliedStack(stack, workdir, log=log)
        cluster = _TimedCluster(admission_plugins=ADMISSION_PLUGINS, base_dir=workdir)
        applied.cluster = cluster
        log("cluster start ...")
        started = time.monotonic()
        try:
            applied.start()
        except Exception as exc:
            run.fail("cluster start and stack creation", exc, time.monotonic() - started)
            run.skip((*EMPTY_STEPS, *STACK_STEPS, *FLOOR_STEPS), "no cluster")
            return run
        try:
            ready = cluster.nodes_ready or time.monotonic()
            run.rows += [
                Row(
                    f"cluster start, {len(applied.nodes)} nodes Ready",
                    round(ready - started, 2),
                    load=round(os.getloadavg()[0], 1),
                ),
                Row(
                    "prerequisites and stack creation",
                    round(time.monotonic() - ready, 2),
                    load=round(os.getloadavg()[0], 1),
                ),
            ]
            measure_empty(run, workdir / "empty")
            measure_stack(run, applied, workdir)
        finally:
            applied.stop()
    return run


def measure_empty(run: Run, state_dir: Path) -> None:
    """A program that declares nothing, under the same engine: `up`, then a no-op `up`."""
    empty = run.attempt(
        "empty program: stack creation", lambda: inline_stack(PROJECT, "empty", _nothing, state_dir)
    )
    if empty is None:
        run.skip(EMPTY_STEPS, "no stack")
    elif run.engine(EMPTY_UP, empty, "up", lambda: 1):
        run.engine(EMPTY_STEPS[1], empty, "up", lambda: 1)
    else:
        run.skip(EMPTY_STEPS[1:], "`up` failed")


def _nothing() -> None:
    """The empty program."""


def measure_stack(run: Run, applied: AppliedStack, workdir: Path) -> None:
    """The stack's runs under the engine, then the floor on the same cluster."""
    engine = applied.engine

    def count() -> int:
        return len(engine.resources())

    if not run.engine(UP, engine.stack, "up", count):
        run.skip((*STACK_STEPS[1:], *FLOOR_STEPS), "`up` failed")
        return
    state = run.attempt(
        "read the state, the nodes and the Helm releases after `up`", lambda: after_up(applied)
    )
    run.attempt("run the stack's pods", applied.sync_pods)
    run.engine(NOOP_UP, engine.stack, "up", count)
    run.engine("preview", engine.stack, "preview", count)
    run.engine("refresh", engine.stack, "refresh", count)
    if applied.runtime is not None:
        applied.runtime.stop()  # as AppliedStack.destroy() does: the pods go
    resources = run.attempt("count the resources before `destroy`", count)
    destroyed = run.engine(DESTROY, engine.stack, "destroy")
    if destroyed is None:
        run.skip(FLOOR_STEPS, "`destroy` failed")
        return
    destroyed.resources = resources
    if state is None:
        run.skip(FLOOR_STEPS, "the state after `up` was not read")
        return

    floor = Floor(applied.api_client(), workdir / "discovery.json")
    chart_crds = [crd for unit in state.units for crd in unit.chart_crds]
    run.attempt("delete the charts' CRDs before the floor", lambda: floor.delete_crds(chart_crds))
    applied_objects = sum(len(unit.objects) + len(unit.chart_crds) for unit in state.units)
    deleted_objects = sum(len(unit.objects) for unit in state.units)
    nodes = f"{len(state.writes)} nodes"

    def apply() -> Detail:
        floor.waited = 0.0
        floor.apply(state.units, state.writes)
        note = f"{floor.waited:.2f} s of it waiting for readiness"
        return Detail(applied_objects, f"apply {applied_objects} objects, {nodes}", note)

    if run.timed(FLOOR_UP, apply) is None:
        run.skip(FLOOR_STEPS[1:], "the floor's apply failed")
        return
    run.attempt("run the floor's pods", applied.sync_pods)
    if applied.runtime is not None:
        applied.runtime.stop()

    def teardown() -> Detail:
        floor.waited = 0.0
        floor.teardown(state.units, state.undo)
        note = f"{floor.waited:.2f} s of it waiting for objects to be gone"
        return Detail(deleted_objects, f"delete {deleted_objects} objects, {nodes}", note)

    row = run.timed(FLOOR_TEARDOWN, teardown)
    restored = row and run.attempt("read the nodes after the floor", applied.node_state)
    if row is not None and restored is not None and restored != applied.nodes_before:
        row.note += "; the nodes differ from before `up`"


def format_table(rows: Sequence[Row]) -> list[str]:
    def cell(value: float | int | None, width: int, digits: int = 2) -> str:
        if value is None:
            return f"{'-':>{width}}"
        return f"{value:>{width}.{digits}f}" if isinstance(value, float) else f"{value:>{width}}"

    lines = [
        f"{'step':<42} {'seconds':>8} {'resources':>9}  {'changes':<30} {'ratio':>6}  "
        f"{'against':<18} {'load':>5}  note"
    ]
    for r in rows:
        lines.append(
            f"{r.step:<42} {cell(r.seconds, 8)} {cell(r.resources, 9)}  {r.changes:<30} "
            f"{cell(r.ratio, 6)}  {r.against:<18} {cell(r.load, 5, 1)}  {r.note}".rstrip()
        )
    return lines


def format_timelines(timelines: Mapping[str, Timeline], every_step: bool = False) -> list[str]:
    names = ("total", "start-up", "resource steps", "engine's end", "after the summary")
    lines = [f"{'engine run':<26}" + "".join(f" {name:>17}" for name in names)]
    for step, timeline in timelines.items():
        if timeline.ended is None:
            continue
        phases = timeline.phases()
        cells = "".join(
            f" {phases[name]:>17.2f}" if phases[name] is not None else f" {'-':>17}"
            for name in names
        )
        lines.append(f"{step:<26}{cells}")
    for step in (UP, NOOP_UP, DESTROY):
        run = timelines.get(step)
        if run is None or run.ended is None:
            continue
        if every_step:
            lines.append(f"\nresource steps of `{step}` (began, ended: seconds into the run):")
            lines += [f"  {began:6.2f} {ended:6.2f}  {what}" for began, ended, what in run.steps()]
        else:
            lines.append(f"\nslowest resource steps of `{step}`:")
            lines += [f"  {seconds:6.2f} s  {what}" for seconds, what in run.slowest()]
    return lines


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    write_rows(path, [f.name for f in fields(Row)], (asdict(row) for row in rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stack", default="local", help="the stack whose shape is measured")
    parser.add_argument(
        "--csv", type=Path, default=DEFAULT_CSV, help="the rows' CSV (default: %(default)s)"
    )
    parser.add_argument(
        "--build-log",
        type=Path,
        nargs="+",
        default=[],
        help="build logs with `built <tool> in <n> s` lines (tools/build-pulumi.sh)",
    )
    parser.add_argument(
        "--no-build", dest="build", action="store_false", help="skip the warm provider builds"
    )
    parser.add_argument(
        "--steps", action="store_true", help="every resource step's start and end, not the slowest"
    )
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    run = measure(args.stack, args.build_log, args.build, log)
    add_ratios(run.rows)
    print("\n".join(format_table(run.rows)))
    print()
    print("\n".join(verdicts(run.rows)))
    print()
    print("\n".join(format_timelines(run.timelines, args.steps)))
    if run.rows:
        write_csv(args.csv, run.rows)
        log(f"wrote {args.csv}")
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
