"""Reads the (major, minor) a Kubernetes version string names.

The one parser for the stack's kubernetesVersion ("v1.37.2"), the API server's gitVersion
("v1.37.2+k3s1", "v1.38.0-alpha.1") and the feature-gate list's "1.37".
"""

from __future__ import annotations

import re

_MAJOR_MINOR = re.compile(r"v?(?P<major>[0-9]+)\.(?P<minor>[0-9]+)", re.ASCII)


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version that starts with [v]MAJOR.MINOR; None for anything else.

    What follows the minor (the patch, a pre-release, build metadata) is not read.
    """
    match = _MAJOR_MINOR.match(version)
    return None if match is None else (int(match["major"]), int(match["minor"]))
