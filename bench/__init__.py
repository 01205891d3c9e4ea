"""Benchmarks: scripts that print tables and write their rows into a study folder under `RESULTS`.

Each study folder answers one question: its README.md (the question, the commands, the inputs,
the conclusion, the run's date and commit) and the files of its current run. bench/README.md
indexes them.
"""

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""The study folders, one per question."""
OPENB_FRAGMENTATION = RESULTS / "openb-fragmentation"
"""bench.openb_replay and bench.plot_curves: allocation on the openb traces, per profile."""
SCHEDULER_DEFAULTS = RESULTS / "scheduler-defaults"
"""bench.binpack_sweep: the scoring knobs and node sampling the stack's scheduler defaults to."""
SCHEDULER_THROUGHPUT = RESULTS / "scheduler-throughput"
"""bench.scheduler_scale: pods per second and latency at 1,213 to 15,000 nodes."""
NODE_LAYERS_SCALE = RESULTS / "node-layers-scale"
"""bench.scale (and bench.engine_cost): the node layers under the real Pulumi CLI."""
WHOLE_PROGRAM = RESULTS / "whole-program"
"""bench.local_stack: the whole program under the real engine against its floor."""
GANG_JOBS = RESULTS / "gang-jobs"
"""bench.openb_replay on a trace with jobs, and bench.gang_scale: gangs against no gangs."""
DRA_REPLAY = RESULTS / "dra-replay"
"""bench.openb_replay and bench.scheduler_scale with --dra: GPUs claimed through DRA."""
ADMISSION_GAP = RESULTS / "admission-gap"
"""bench.admission_gap: pods the gate refuses while a restarted API server starts."""
POOL_FENCE = RESULTS / "pool-fence"
"""bench.pool_fence: what the pool fence costs a pod create as the pool grows."""


def write_rows(path: Path, fields: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV file with `fields` as its header, one line per row (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(fields: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table: `fields` as its header, one line per row."""
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(str(row[f]) for f in fields) + " |" for row in rows]
    return "\n".join(lines)
