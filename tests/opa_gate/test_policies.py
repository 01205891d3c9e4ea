"""The Rego policies pass the real OPA's unit tests, strict check and formatter."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import built_tool

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "components" / "opa_gate" / "policies"

# `opa test -v` prints one "data.<package>.<test>: <RESULT> (<duration>)" line per test.
RESULT_LINE = re.compile(r"^data\.\S+: (?P<result>PASS|FAIL|ERROR|SKIPPED)\b", re.MULTILINE)
SUMMARY_PASS = re.compile(r"^PASS: (?P<passed>\d+)/(?P<total>\d+)$", re.MULTILINE)
PACKAGE_LINE = re.compile(r"^package\s+(?P<name>\S+)", re.MULTILINE)


@pytest.fixture(scope="module")
def opa() -> Path:
    """The harness's OPA: skipped when not built, a failure under CI=true."""
    return built_tool("opa")


def _run_opa(opa: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(opa), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _policy_files() -> list[Path]:
    return sorted(p for p in POLICIES.glob("*.rego") if not p.name.endswith("_test.rego"))


def _package(path: Path) -> str:
    match = PACKAGE_LINE.search(path.read_text())
    assert match, f"{path.name} declares no package"
    return match["name"]


def test_policies_opa_test_passes(opa: Path) -> None:
    result = _run_opa(opa, "test", "components/opa_gate/policies/", "-v")
    output = result.stdout + result.stderr

    results = [m["result"] for m in RESULT_LINE.finditer(output)]
    summary = SUMMARY_PASS.search(output)
    assert result.returncode == 0, output
    assert results, f"no test results in output:\n{output}"
    assert set(results) == {"PASS"}, output
    assert summary, output
    assert int(summary["passed"]) == int(summary["total"]) == len(results)


def test_policies_opa_check_strict_passes(opa: Path) -> None:
    result = _run_opa(opa, "check", "--strict", "components/opa_gate/policies/")

    assert result.returncode == 0, result.stdout + result.stderr


def test_policies_opa_fmt_reports_no_changes(opa: Path) -> None:
    result = _run_opa(opa, "fmt", "--list", "components/opa_gate/policies/")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "", (
        f"run `opa fmt -w components/opa_gate/policies/`; unformatted:\n{result.stdout}"
    )


def test_policies_exist() -> None:
    assert _policy_files(), "no components/opa_gate/policies/*.rego found"


@pytest.mark.parametrize("policy", _policy_files(), ids=lambda p: p.name)
def test_policies_have_a_test_file_beside_them_in_the_same_package(policy: Path) -> None:
    test_file = policy.with_name(f"{policy.stem}_test.rego")

    assert test_file.is_file(), f"{policy.name} has no {test_file.name} beside it"
    assert _package(test_file) == _package(policy)


@pytest.mark.parametrize("test_file", sorted(POLICIES.glob("*_test.rego")), ids=lambda p: p.name)
def test_policies_test_files_have_a_policy_beside_them(test_file: Path) -> None:
    policy = test_file.with_name(test_file.name.removesuffix("_test.rego") + ".rego")

    assert policy.is_file(), f"{test_file.name} tests {policy.name}, which does not exist"
