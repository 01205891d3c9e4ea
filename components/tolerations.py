"""Whether a pod's toleration tolerates a node's taint, matched as Kubernetes matches them (the
scheduler's TaintToleration plugin, the taint manager): one definition for every check of the
stack that reads tolerations off live objects.

A toleration and a taint are plain mappings as the API serves them (camelCase keys; a field
left empty is absent).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# An int64 written as Kubernetes accepts it for Lt and Gt: no sign but a minus, no leading zero
# (apimachinery's content.IsDecimalInteger), then parsed base 10.
_DECIMAL_INTEGER = re.compile(r"0|-?[1-9][0-9]*", re.ASCII)
_INT64 = range(-(2**63), 2**63)


def _integer(value: str) -> int | None:
    if _DECIMAL_INTEGER.fullmatch(value) is None or int(value) not in _INT64:
        return None
    return int(value)


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """Whether `toleration` tolerates `taint`: an empty effect matches every effect, else it
    must be the taint's; an empty key matches every key (the API server stores one only with
    operator Exists), else it must be the taint's; operator Exists matches every value, Equal
    (or none) the same value (a missing value is ""); Lt and Gt (feature gate
    TaintTolerationComparisonOperators, stored only where the API server turns it on) compare
    both values as decimal integers, and match nothing when either is not one.
    Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/core/v1/toleration.go
    """
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect", ""):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key", ""):
        return False
    operator = toleration.get("operator") or ""
    value = toleration.get("value") or ""
    if operator in ("", "Equal"):
        return bool(value == taint.get("value", ""))
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt"):
        wanted, have = _integer(str(value)), _integer(taint.get("value", ""))
        if wanted is None or have is None:
            return False
        return have < wanted if operator == "Lt" else have > wanted
    return False


def tolerates_any(
    tolerations: Iterable[Mapping[str, Any]] | None, taint: Mapping[str, str]
) -> bool:
    """Whether one of `tolerations` (a pod spec's, possibly absent) tolerates `taint`."""
    return any(tolerates(t, taint) for t in tolerations or () if isinstance(t, Mapping))
