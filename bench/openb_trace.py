"""The openb trace: its node and pod lists read and checked, empty-node fits, arrival orders.

A pod list may carry a `job` column (bench.derive_trace --jobs): pods naming the same job are
the workers of one distributed job, replayed as a gang; an empty value is a pod on its own.

Also the command-line arguments that name a trace and its slice (the replay's, the sweep's and
the scale bench's).
"""

from __future__ import annotations

import argparse
import csv
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NODES_FILE = "openb_node_list_gpu_node.csv"
DEFAULT_PODS_FILE = "openb_pod_list_default.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time")
JOB_COLUMN = "job"
"""The optional pod-list column naming a pod's job (empty: a pod on its own)."""


class TraceError(ValueError):
    """A trace file is missing a column or holds a value out of range."""


@dataclass(frozen=True, kw_only=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True, kw_only=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    """Whole GPUs requested (shared GPUs rounded up to one)."""
    creation_time: int
    deletion_time: int | None = None
    gpu_milli: int = 1000
    """Thousandths of each GPU the pod uses (below 1000: it shares one)."""
    job: str | None = None
    """The job the pod is a worker of (the `job` column); None for a pod on its own."""

    @property
    def gpu_share(self) -> float:
        """GPUs the pod uses, a shared GPU counted as its fraction."""
        return self.gpus * min(self.gpu_milli, 1000) / 1000 if self.gpus else 0.0


def gpu_request(num_gpu: int, gpu_milli: int) -> int:
    """Whole nvidia.com/gpu a trace pod asks for: num_gpu, and at least one if it shares one."""
    if num_gpu == 0 and gpu_milli > 0:
        return 1
    return num_gpu


def _int(path: Path, line: int, row: Mapping[str, str], column: str, low: int = 0) -> int:
    raw = row.get(column)
    try:
        value = int(raw or "")
    except ValueError:
        value = low - 1
    if value < low:
        raise TraceError(
            f"{path}:{line}: column {column!r} is {raw!r}; expected an integer >= {low}"
        )
    return value


def _rows(path: Path, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(columns)}"
            )
        yield from enumerate(reader, start=2)


def read_nodes(path: Path) -> list[TraceNode]:
    """The node list, in file order."""
    return [
        TraceNode(
            name=row["sn"],
            cpu_milli=_int(path, line, row, "cpu_milli", 1),
            memory_mib=_int(path, line, row, "memory_mib", 1),
            gpus=_int(path, line, row, "gpu"),
        )
        for line, row in _rows(path, NODE_COLUMNS)
    ]


def read_pods(path: Path) -> list[TracePod]:
    """The pod list in arrival order (creation_time, then file order)."""
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        gpu_milli = _int(path, line, row, "gpu_milli")
        if gpu_milli > 1000:
            raise TraceError(
                f"{path}:{line}: column 'gpu_milli' is {gpu_milli}; expected 0..1000 (per GPU)"
            )
        deletion = (row.get("deletion_time") or "").strip()
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=gpu_request(_int(path, line, row, "num_gpu"), gpu_milli),
                creation_time=_int(path, line, row, "creation_time"),
                deletion_time=_int(path, line, row, "deletion_time") if deletion else None,
                gpu_milli=gpu_milli,
                job=(row.get(JOB_COLUMN) or "").strip() or None,
            )
        )
    return sorted(pods, key=lambda p: p.creation_time)  # stable: ties keep file order


def fits(pod: TracePod, node: TraceNode) -> bool:
    """Whether `pod` fits `node` when nothing of the trace runs there."""
    return (
        pod.gpus <= node.gpus
        and pod.cpu_milli <= node.cpu_milli
        and pod.memory_mib <= node.memory_mib
    )


def fitting(pods: Sequence[TracePod], nodes: Sequence[TraceNode]) -> list[bool]:
    """For each pod, whether some empty node fits it (`nodes` as the scheduler sees them)."""
    shapes = {(n.gpus, n.cpu_milli, n.memory_mib): n for n in nodes}.values()
    return [any(fits(pod, node) for node in shapes) for pod in pods]


def arrival_units(pods: Sequence[TracePod]) -> list[list[TracePod]]:
    """The pods as they arrive together: each job's workers at its first worker's place, every
    other pod on its own, in `pods`' order."""
    units: list[list[TracePod]] = []
    of_job: dict[str, list[TracePod]] = {}
    for pod in pods:
        if pod.job is None:
            units.append([pod])
        elif pod.job in of_job:
            of_job[pod.job].append(pod)
        else:
            of_job[pod.job] = [pod]
            units.append(of_job[pod.job])
    return units


def arrival_order(pods: Sequence[TracePod], order: int) -> list[TracePod]:
    """The pods in arrival order `order`: 0 the trace's, n > 0 shuffled with seed n.

    A job arrives whole: its workers follow one another at its first worker's place, and a
    shuffle moves the job as one (without jobs, the same shuffle as of single pods).
    """
    units = arrival_units(pods)
    if order:
        units = random.Random(order).sample(units, len(units))
    return [pod for unit in units for pod in unit]


def jobs_of(pods: Sequence[TracePod]) -> dict[str, list[int]]:
    """Each job's workers as positions in `pods`, jobs in the order their first worker comes."""
    jobs: dict[str, list[int]] = {}
    for index, pod in enumerate(pods):
        if pod.job is not None:
            jobs.setdefault(pod.job, []).append(index)
    return jobs


def add_trace_arguments(parser: argparse.ArgumentParser, csv_default: Path) -> None:
    """The arguments naming a trace and its slice (the replay's and the sweep's)."""
    parser.add_argument("trace", type=Path, help="trace directory (e.g. ../shared/traces/openb)")
    parser.add_argument("--pods-file", default=DEFAULT_PODS_FILE, help="pod list in trace")
    parser.add_argument("--nodes-file", default=DEFAULT_NODES_FILE, help="node list in trace")
    parser.add_argument(
        "--csv", type=Path, default=csv_default, help="CSV to write (default: %(default)s)"
    )
    parser.add_argument("--limit", type=int, help="replay only the first N pods")
    parser.add_argument("--node-limit", type=int, help="use only the first N nodes")


def load_trace(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[TraceNode], list[TracePod]]:
    """The nodes and pods `add_trace_arguments` named; a bad limit or trace is a usage error."""
    for flag, value in (("--limit", args.limit), ("--node-limit", args.node_limit)):
        if value is not None and value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    try:
        nodes = read_nodes(args.trace / args.nodes_file)[: args.node_limit]
        pods = read_pods(args.trace / args.pods_file)[: args.limit]
    except TraceError as exc:
        parser.error(str(exc))
    return nodes, pods


def node_counts(parser: argparse.ArgumentParser, raw: str) -> list[int]:
    """The comma-separated node counts of `raw` (--nodes); a usage error unless each is >= 1."""
    try:
        counts = [int(n) for n in raw.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        parser.error(f"--nodes {raw!r}: expected comma-separated integers >= 1")
    return counts


def comma_choices(
    parser: argparse.ArgumentParser, flag: str, raw: str, allowed: Sequence[str]
) -> list[str]:
    """The comma-separated items of `raw`; a usage error unless each is `allowed`."""
    chosen = [item.strip() for item in raw.split(",") if item.strip()]
    if not chosen or any(item not in allowed for item in chosen):
        parser.error(f"{flag} {raw!r}: expected some of {', '.join(allowed)}")
    return chosen
