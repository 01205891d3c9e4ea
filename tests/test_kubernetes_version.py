"""components/kubernetes_version.py: the (major, minor) of the version strings the stack meets."""

from __future__ import annotations

import pytest

from components.kubernetes_version import major_minor


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("v1.37.2", (1, 37)),
        ("1.37", (1, 37)),
        ("1.8", (1, 8)),
        ("v1.37.2+k3s1", (1, 37)),
        ("v1.38.0-alpha.1", (1, 38)),
        ("v2.0", (2, 0)),
        ("v1", None),
        ("", None),
        ("latest", None),
        ("1.x", None),
    ],
)
def test_kubernetes_version_major_minor(version: str, expected: tuple[int, int] | None) -> None:
    assert major_minor(version) == expected
