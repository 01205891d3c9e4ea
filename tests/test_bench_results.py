"""bench/results: one folder per study, each described by its README, kept by git, linked.

The scripts write into these folders by default; the index (bench/README.md) and the studies'
READMEs link to each other and to the plots.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import RESULTS

BENCH = RESULTS.parent
REPO = BENCH.parent
STUDIES = sorted(path for path in RESULTS.iterdir() if path.is_dir())
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _default_outputs() -> dict[str, Path]:
    from bench import binpack_sweep, gang_scale, local_stack, openb_replay, scale, scheduler_scale

    outputs = {
        module.__name__: module.DEFAULT_CSV
        for module in (openb_replay, binpack_sweep, scheduler_scale, scale, local_stack, gang_scale)
    }
    outputs["bench.openb_replay (a trace with jobs)"] = openb_replay.JOBS_CSV
    outputs["bench.openb_replay --dra"] = openb_replay.DRA_CSV
    outputs["bench.scheduler_scale --dra"] = scheduler_scale.DRA_CSV
    return outputs


def test_bench_results_hold_only_study_folders_each_with_a_readme() -> None:
    assert STUDIES
    assert [p.name for p in RESULTS.iterdir() if not p.is_dir()] == []
    assert [s.name for s in STUDIES if not (s / "README.md").is_file()] == []


def test_bench_scripts_write_into_a_study_folder_by_default() -> None:
    outside = {
        name: path for name, path in _default_outputs().items() if path.parent not in STUDIES
    }
    assert outside == {}


def test_bench_every_result_file_is_named_in_its_study_readme() -> None:
    unnamed = []
    for study in STUDIES:
        readme = (study / "README.md").read_text()
        unnamed += [
            path.relative_to(RESULTS).as_posix()
            for path in study.iterdir()
            if path.name != "README.md" and f"`{path.name}`" not in readme
        ]
    assert unnamed == []


def test_bench_index_links_every_study_and_every_link_resolves() -> None:
    index = BENCH / "README.md"
    linked = {(index.parent / target).resolve() for target in LINK.findall(index.read_text())}
    assert [s.name for s in STUDIES if (s / "README.md").resolve() not in linked] == []
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in (index, *(s / "README.md" for s in STUDIES))
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert broken == []


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_bench_gitignore_keeps_every_result_file() -> None:
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True
    )
    if inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(REPO)) for p in RESULTS.rglob("*") if p.is_file()]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=REPO,
        input="\n".join(files),
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == []
    stray = RESULTS / "stray.csv"
    probe = subprocess.run(
        ["git", "check-ignore", "--no-index", str(stray.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, "a file loose in bench/results/ should be ignored"
