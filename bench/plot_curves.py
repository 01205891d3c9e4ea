"""Draw the openb replay's allocation curves: GPU allocation against arrived GPU demand.

One PNG per fleet, two panels: whole GPUs (a shared GPU rounded up to one, as the pods ask
for it) and shared GPUs counted as their fractions. Each profile is a line, the mean over
arrival orders, with the band between the lowest and highest order; the x axis is the GPU
demand arrived so far over the cluster's GPUs (the style of FGD's figure 1).

    .venv/bin/python -m bench.plot_curves bench/results/openb-fragmentation/openb_realistic.curve.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from bench.replay_cluster import ALL_PROFILES
from bench.replay_results import CURVE_COLUMNS

GRID_STEP = 0.005
PANELS = (
    ("whole GPUs", "arrived", "allocated"),
    ("shared GPUs as fractions", "arrived_shared", "allocated_shared"),
)


def read_curves(path: Path) -> dict[tuple[str, str, str], list[dict[str, np.ndarray]]]:
    """{(fleet, profile, order-run): [columns]} grouped by (fleet, profile) and run."""
    runs: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            key = (row["fleet"], row["profile"], f"{row['order']}/{row['run']}")
            for column in CURVE_COLUMNS:
                runs[key][column].append(float(row[column]))
    grouped: dict[tuple[str, str, str], list[dict[str, np.ndarray]]] = defaultdict(list)
    for (fleet, profile, _), columns in runs.items():
        grouped[(fleet, profile, "")].append({k: np.array(v) for k, v in columns.items()})
    return grouped


def band(runs: Sequence[dict[str, np.ndarray]], x: str, y: str) -> tuple[np.ndarray, ...]:
    """(grid, mean, low, high) of `y` against `x` over `runs`, up to the least arrived end."""
    end = min(run[x][-1] for run in runs)
    grid = np.arange(0.0, end + GRID_STEP / 2, GRID_STEP)
    values = np.array([np.interp(grid, run[x], run[y]) for run in runs])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def png_name(curves: Path, fleet: str) -> str:
    """`<stem>_<fleet>.png` for the curve file `<stem>.curve.csv`; a stem that already ends in
    `_<fleet>` (a file holding one fleet, named for it) is not given the fleet twice."""
    stem = curves.name.removesuffix(".curve.csv").removesuffix(f"_{fleet}")
    return f"{stem}_{fleet}.png"


def draw(path: Path, out_dir: Path) -> list[Path]:
    """Write one PNG per fleet in `out_dir` (made if missing); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = read_curves(path)
    fleets = sorted({fleet for fleet, _, _ in curves})
    written = []
    for fleet in fleets:
        figure = Figure(figsize=(11, 4.2))
        axes = figure.subplots(1, 2, sharey=True)
        for axis, (title, x, y) in zip(axes, PANELS, strict=True):
            for profile in ALL_PROFILES:
                runs = curves.get((fleet, profile, ""))
                if not runs:
                    continue
                grid, mean, low, high = band(runs, x, y)
                (line,) = axis.plot(grid * 100, mean * 100, label=f"{profile} ({len(runs)})")
                axis.fill_between(
                    grid * 100, low * 100, high * 100, alpha=0.2, color=line.get_color()
                )
            axis.plot([0, 100], [0, 100], color="grey", linewidth=0.6, linestyle=":")
            axis.set_title(f"{fleet} fleet, {title}")
            axis.set_xlabel("arrived GPU demand, % of the cluster's GPUs")
            axis.grid(alpha=0.3)
        axes[0].set_ylabel("GPUs allocated, %")
        axes[0].legend(loc="lower right", title="profile (orders)")
        figure.tight_layout()
        target = out_dir / png_name(path, fleet)
        figure.savefig(target, dpi=110)
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("curves", type=Path, help="a .curve.csv the replay wrote")
    parser.add_argument("--out", type=Path, help="directory for the PNGs (default: beside it)")
    args = parser.parse_args(argv)
    if not args.curves.is_file():
        parser.error(f"{args.curves}: no such file (bench.openb_replay writes it beside --csv)")
    for target in draw(args.curves, args.out or args.curves.parent):
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
