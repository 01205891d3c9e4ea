"""Benchmarks: scripts that print tables and write their rows under `RESULTS`."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where every benchmark writes its CSV files (and the curves' PNGs)."""
