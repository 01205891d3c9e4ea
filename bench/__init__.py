"""Benchmarks: scripts that print tables and write their rows under `RESULTS`."""

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""Where every benchmark writes its CSV files (and the curves' PNGs)."""


def write_rows(path: Path, fields: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV file with `fields` as its header, one line per row (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
