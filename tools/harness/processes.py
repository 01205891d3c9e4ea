"""This machine's processes as /proc shows them: who started whom, what runs, how much memory.

Used to find and signal the CLI a test started (and the plugins it started in turn), and by the
benches that measure each process's memory. Linux only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    name: str
    """The executable's short name (`comm`)."""
    argv: tuple[str, ...]


def process_table() -> dict[int, ProcessInfo]:
    """Every process that could be read, by pid (one that exits meanwhile is left out)."""
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        found[int(entry.name)] = ProcessInfo(int(entry.name), ppid, name, argv)
    return found


def descendants(pid: int, table: dict[int, ProcessInfo] | None = None) -> list[int]:
    """The processes `pid` started, and theirs, nearest first."""
    table = process_table() if table is None else table
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {p.pid for p in table.values() if p.ppid in frontier}
        found += sorted(frontier)
    return found


def rss_mib(pid: int) -> float:
    """`pid`'s resident set (VmRSS) in MiB; 0 when it is gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
