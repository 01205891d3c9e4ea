#!/usr/bin/env python3
"""Add admission plugins and feature gates to kubeadm-managed files, and take them out again.

This one file is copied to each host and run there with ``python3``. It edits three kinds of files
written by kubeadm, line by line (it never re-serialises YAML, so comments, key order and quoting
survive):

``apiserver-manifest``
    The kube-apiserver static pod manifest (``/etc/kubernetes/manifests/kube-apiserver.yaml``):
    the ``--enable-admission-plugins`` and ``--feature-gates`` items of the ``command`` list whose
    first item is ``kube-apiserver``.
``kubelet-config``
    A KubeletConfiguration (``/var/lib/kubelet/config.yaml``, or the ``kubelet`` key of the
    kubelet-config ConfigMap): its top-level ``featureGates`` mapping.
``kubeadm-config``
    The ClusterConfiguration document of the kube-system/kubeadm-config ConfigMap, so that
    ``kubeadm upgrade`` keeps the settings: ``apiServer.extraArgs``, a mapping in
    kubeadm.k8s.io/v1beta3 and a name/value list in kubeadm.k8s.io/v1beta4.

Usage::

    kube_flags_edit.py apiserver-manifest apply --file F --state S \\
        [--admission-plugins A,B] [--feature-gates X=true,Y=false] [--kubernetes-version v1.34.2] \\
        [--backup-dir D] [--out PATH|-] [--dry-run]
    kube_flags_edit.py apiserver-manifest revert --file F --state S [--backup-dir D] [--out PATH|-]
    (the same for kubelet-config, which takes no --admission-plugins, and kubeadm-config)

Merge rules: configured admission plugins are appended to the existing list (kept in order, no
duplicates); configured feature gates are merged into the existing ones, and a gate already set to
another value gets the configured value (the old one is recorded). Nothing else is touched. A
missing flag, ``featureGates`` block or extraArgs entry is created; new lines go where kubeadm
would put them (kubeadm writes flags and keys sorted) when the neighbours are sorted, else after
the last one. A missing ``--enable-admission-plugins`` flag in the manifest gets only the
configured plugins; a missing ``enable-admission-plugins`` kubeadm extraArg starts with
``NodeRestriction``, because kubeadm's own default is replaced by the arg once it exists (revert
takes the whole arg out again). Files may use LF or CRLF line endings (not both).

State: the JSON file given by ``--state`` records exactly what this program added or changed: the
entries it added, the entries whose value it changed (with the old value), the settings or blocks
it created, and the original text of a ``{}`` block it expanded. ``apply`` uses it to converge (an
entry this program added earlier and no longer configured is removed again, a value it changed is
restored); ``revert`` takes out exactly those edits, restores changed values and deletes the state
file. An entry a human changed after this program wrote it is left alone (and dropped from the
state, with a warning). When nothing else changed in between, ``revert`` gives back the original
file byte for byte.

Backup: before the first write of an in-place edit, the untouched file is copied to
``<backup-dir>/<path with / replaced by _>.orig`` (default backup dir /var/lib/gpu-cluster/backups)
if no such copy exists yet, so it is the original from before this program's first edit. ``revert``
deletes it when the reverted file is byte-identical to it and keeps it otherwise. The backup and the
state are never put in the static pod manifests directory: the kubelet starts a pod from *every*
file there whose name does not begin with a dot, whatever its extension, so a copy such as
``kube-apiserver.yaml.bak`` would run a second kube-apiserver. The program refuses a
``--backup-dir`` or ``--state`` inside the manifest's directory.

Writes are atomic: a temporary file named ``.<name>.<random>.gpu-cluster-tmp`` (leading dot, so the
kubelet ignores it) is written in the target's directory, fsynced, given the original file's mode
and owner, and renamed over the target; the directory is then fsynced.

Version awareness: with ``--kubernetes-version``, configured feature gates that are locked (GA or
deprecated and locked to their default), removed, or not yet introduced in that version are left
out with a warning; gates missing from ``GATE_LIFECYCLE`` pass through.

``--out PATH`` writes the result to PATH and leaves ``--file`` untouched (no backup then); this is
meant for documents taken out of a ConfigMap (kubeadm-config's ClusterConfiguration, the
kubelet-config ConfigMap's KubeletConfiguration) that the caller puts back. The state's recorded
file path is only enforced for in-place edits.

Output: one JSON line on stdout (``file``, ``changed``, ``added``, ``removed``,
``changed_values``, ``warnings`` and more); with ``--out -`` the edited document goes to stdout and
the JSON line to stderr. ``--dry-run`` writes nothing and prints a unified diff on stderr.
Exit status: 0 on success (changed or not), 2 when the file cannot be parsed confidently or the
command line is wrong (nothing is written; the reason is on stderr), 1 on any other error.

The Pulumi program imports this module (``filter_gates``, ``GATE_LIFECYCLE``, ``apply_edit``,
``revert_edit``, ``build_argv``); importing it has no side effects.
"""

# Host constraint: the hosts run whatever python3 their distribution ships, possibly Python 3.8,
# and may lack PyYAML. So this file imports only the standard library and uses only Python 3.8
# syntax and APIs: no match statement, no `X | Y` outside annotations (the __future__ import keeps
# annotations unevaluated), no str.removeprefix, no zip(strict=...). The repository's ruff
# configuration targets py311; nothing here needs a py311-only rewrite, so no UP rule is silenced.

from __future__ import annotations

import argparse
import contextlib
import copy
import difflib
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

TARGETS = ("apiserver-manifest", "kubelet-config", "kubeadm-config")
ACTIONS = ("apply", "revert")
DEFAULT_BACKUP_DIR = "/var/lib/gpu-cluster/backups"
STATE_SCHEMA = 1
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
PROG = "kube_flags_edit"

# --------------------------------------------------------------------------------------------
# Feature gate lifecycle
# --------------------------------------------------------------------------------------------


class GateStage(NamedTuple):
    """One stage of a feature gate, valid from Kubernetes ``since`` (``"1.33"``) onwards."""

    since: str
    stage: str  # "alpha" | "beta" | "ga" | "deprecated"
    default: bool
    locked: bool = False


class GateLifecycle(NamedTuple):
    """The stages of a feature gate, oldest first, and the release that dropped it, if known."""

    stages: tuple[GateStage, ...]
    removed: str | None = None


# Taken from the versioned feature specs in kubernetes/kubernetes (pkg/features) and the KEPs. Only
# entries that were checked against the upstream source are listed; unknown gates pass through.
# "removed" is left empty where the removal is only planned ("remove in 1.38" comments), because a
# locked gate is left out anyway.
GATE_LIFECYCLE: dict[str, GateLifecycle] = {
    "InPlacePodVerticalScaling": GateLifecycle(
        (
            GateStage("1.27", "alpha", False),
            GateStage("1.33", "beta", True),
            GateStage("1.35", "ga", True, locked=True),
        )
    ),
    "SidecarContainers": GateLifecycle(
        (
            GateStage("1.28", "alpha", False),
            GateStage("1.29", "beta", True),
            GateStage("1.33", "ga", True, locked=True),
        )
    ),
    "DynamicResourceAllocation": GateLifecycle(
        (
            GateStage("1.26", "alpha", False),
            GateStage("1.32", "beta", False),
            GateStage("1.34", "ga", True),
            GateStage("1.35", "ga", True, locked=True),
        )
    ),
    "DevicePluginCDIDevices": GateLifecycle(
        (
            GateStage("1.28", "alpha", False),
            GateStage("1.29", "beta", True),
            GateStage("1.31", "ga", True, locked=True),
        )
    ),
    "PodLevelResources": GateLifecycle(
        (
            GateStage("1.32", "alpha", False),
            GateStage("1.34", "beta", True),
        )
    ),
    "DRAAdminAccess": GateLifecycle(
        (
            GateStage("1.32", "alpha", False),
            GateStage("1.34", "beta", True),
            GateStage("1.36", "ga", True, locked=True),
        )
    ),
    "DRAPrioritizedList": GateLifecycle(
        (
            GateStage("1.33", "alpha", False),
            GateStage("1.34", "beta", True),
            GateStage("1.36", "ga", True),
            GateStage("1.37", "ga", True, locked=True),
        )
    ),
    "DRAResourceClaimDeviceStatus": GateLifecycle(
        (
            GateStage("1.32", "alpha", False),
            GateStage("1.33", "beta", True),
            GateStage("1.37", "ga", True, locked=True),
        )
    ),
    "DRAPartitionableDevices": GateLifecycle(
        (
            GateStage("1.33", "alpha", False),
            GateStage("1.36", "beta", True),
        )
    ),
    "DRADeviceTaints": GateLifecycle(
        (
            GateStage("1.33", "alpha", False),
            GateStage("1.36", "beta", True),
            GateStage("1.37", "ga", True),
        )
    ),
    "DRAExtendedResource": GateLifecycle(
        (
            GateStage("1.34", "alpha", False),
            GateStage("1.36", "beta", True),
            GateStage("1.37", "ga", True, locked=True),
        )
    ),
    "DRAConsumableCapacity": GateLifecycle(
        (
            GateStage("1.34", "alpha", False),
            GateStage("1.36", "beta", True),
        )
    ),
}

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?$")
_GO_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_GO_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))
_YAML_TRUE = frozenset(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"))
_YAML_FALSE = frozenset(
    ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def parse_version(version: str) -> tuple[int, int]:
    """``"v1.34.2"``, ``"1.34"`` or ``"v1.35.0-rc.1"`` -> ``(1, 34)``; ValueError otherwise."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise ValueError(f"not a Kubernetes version: {version!r} (expected e.g. v1.34.2)")
    return int(m.group(1)), int(m.group(2))


def gate_stage(name: str, version: str) -> GateStage | None:
    """The stage of a known gate in ``version``; None if unknown, not yet introduced or removed."""
    lifecycle = GATE_LIFECYCLE.get(name)
    if lifecycle is None:
        return None
    v = parse_version(version)
    if lifecycle.removed is not None and v >= parse_version(lifecycle.removed):
        return None
    current = None
    for stage in lifecycle.stages:
        if parse_version(stage.since) <= v:
            current = stage
    return current


def filter_gates(gates: Mapping[str, Any], version: str | None) -> tuple[dict[str, Any], list[str]]:
    """Split configured gates into those to set in ``version`` and warnings for the rest.

    A gate is left out when, in that version, it is locked to its default (GA or deprecated),
    removed, or not introduced yet: setting a locked gate to the other value, or an unknown gate,
    stops the component from starting. Gates missing from GATE_LIFECYCLE pass through silently.
    Without a version everything passes. Values are returned unchanged, in the given order.
    """
    if version is None:
        return dict(gates), []
    major, minor = parse_version(version)
    shown = f"v{major}.{minor}"
    kept: dict[str, Any] = {}
    warnings: list[str] = []
    for name, value in gates.items():
        lifecycle = GATE_LIFECYCLE.get(name)
        if lifecycle is None:
            kept[name] = value
            continue
        if lifecycle.removed is not None and (major, minor) >= parse_version(lifecycle.removed):
            warnings.append(
                f"feature gate {name} was removed in v{lifecycle.removed} and does not exist "
                f"in {shown}; leaving it out"
            )
            continue
        stage = gate_stage(name, version)
        if stage is None:
            first = lifecycle.stages[0]
            warnings.append(
                f"feature gate {name} does not exist in {shown} (it appears as {first.stage} in "
                f"v{first.since}); leaving it out"
            )
            continue
        if stage.locked:
            label = "GA" if stage.stage == "ga" else stage.stage
            state = "on" if stage.default else "off"
            warnings.append(
                f"feature gate {name} is {label} and locked {state} in {shown}; leaving it out"
            )
            continue
        kept[name] = value
    return kept, warnings


def format_gates(gates: Mapping[str, Any]) -> str:
    """``{"A": True, "B": "false"}`` -> ``"A=true,B=false"`` (the --feature-gates syntax)."""
    return ",".join(f"{name}={_gate_value(name, value)}" for name, value in gates.items())


def _gate_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text in _GO_TRUE:
        return "true"
    if text in _GO_FALSE:
        return "false"
    raise ValueError(f"feature gate {name}: value {value!r} is not true or false")


# --------------------------------------------------------------------------------------------
# Errors and results
# --------------------------------------------------------------------------------------------


class Refusal(Exception):
    """The input cannot be edited confidently; nothing is written (exit status 2)."""


class UsageError(Exception):
    """A wrong command line or argument (exit status 2)."""


class EditResult(NamedTuple):
    """The outcome of apply_edit / revert_edit. ``state`` is None after a revert."""

    text: str
    state: dict[str, Any] | None
    changed: bool
    added: list[str]
    removed: list[str]
    changed_values: dict[str, dict[str, str]]
    warnings: list[str]


class _Report:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []
        self.changed_values: dict[str, dict[str, str]] = {}
        self.warnings: list[str] = []


# --------------------------------------------------------------------------------------------
# A block-style YAML document as a list of lines
# --------------------------------------------------------------------------------------------

_KEY_RE = re.compile(
    r"^(?P<indent> *)(?P<dash>-[ ]+)?(?P<key>[A-Za-z0-9_][A-Za-z0-9_.\-]*)[ ]*:"
    r"(?P<rest>(?:[ \t].*)?)$"
)
_ITEM_RE = re.compile(r"^(?P<indent> *)-(?P<sep>[ ]+)(?P<rest>\S.*)$")
_COMMENT_TAIL_RE = re.compile(r"^[ \t]*(?:#.*)?$")
_PLAIN_BAD_START = ",[]{}#&*!|>'\"%@`"


class _Scalar(NamedTuple):
    start: int  # the scalar's source text is line[start:end], quotes included
    end: int
    value: str  # the decoded value
    quote: str  # "", '"' or "'"


def _scalar_at(line: str, pos: int, lineno: int) -> _Scalar | None:
    """Parse a one-line scalar starting at or after ``pos``; None if only a comment follows."""
    i = pos
    while i < len(line) and line[i] in " \t":
        i += 1
    if i == len(line) or line[i] == "#":
        return None
    where = f"line {lineno + 1}"
    c = line[i]
    if c == '"':
        j = line.find('"', i + 1)
        if j < 0:
            raise Refusal(f"{where}: unterminated double-quoted string")
        value = line[i + 1 : j]
        if "\\" in value:
            raise Refusal(f"{where}: escape sequences in double-quoted strings are not supported")
        end, quote = j + 1, '"'
    elif c == "'":
        j, parts = i + 1, []
        while True:
            k = line.find("'", j)
            if k < 0:
                raise Refusal(f"{where}: unterminated single-quoted string")
            if line[k + 1 : k + 2] == "'":
                parts.append(line[j : k + 1])
                j = k + 2
                continue
            parts.append(line[j:k])
            end = k + 1
            break
        value, quote = "".join(parts), "'"
    else:
        if c in "{[":
            raise Refusal(f"{where}: flow-style collections are not supported here")
        if c in "&*!|>%@`":
            raise Refusal(
                f"{where}: unsupported YAML construct {c!r} (anchor, alias, tag or block scalar)"
            )
        m = re.search(r"[ \t]#", line[i:])
        raw_end = i + m.start() if m else len(line)
        value = line[i:raw_end].rstrip(" \t")
        end, quote = i + len(value), ""
        if ": " in value or value.endswith(":") or ":\t" in value:
            raise Refusal(f"{where}: value {value!r} looks like a nested mapping")
    if not _COMMENT_TAIL_RE.match(line[end:]) or (line[end : end + 1] == "#"):
        raise Refusal(f"{where}: unexpected text after the value: {line[end:].strip()!r}")
    return _Scalar(i, end, value, quote)


def _render_scalar(value: str, quote: str) -> str:
    """The YAML source text of ``value``, in the given quoting style where that is possible."""
    if quote == "'":
        return "'" + value.replace("'", "''") + "'"
    plain_ok = (
        value != ""
        and value == value.strip()
        and value[0] not in _PLAIN_BAD_START
        and not (value[0] in "-?:" and (len(value) == 1 or value[1] == " "))
        and ": " not in value
        and " #" not in value
        and not value.endswith(":")
    )
    if quote == "" and plain_ok:
        return value
    if '"' in value or "\\" in value:
        raise Refusal(f"cannot write {value!r} as a YAML string without escapes")
    return f'"{value}"'


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_content(line: str) -> bool:
    s = line.strip()
    return s != "" and not s.startswith("#")


def _is_dash(line: str) -> bool:
    s = line.strip()
    return s == "-" or s.startswith("- ")


def _value_kind(rest: str) -> str:
    """Classify what follows ``key:``: "block", "flow-empty", "flow" or "scalar"."""
    s = rest.strip()
    if s == "" or s.startswith("#"):
        return "block"
    if re.match(r"^(\{\s*\}|\[\s*\])\s*(#.*)?$", s):
        return "flow-empty"
    if s[0] in "{[":
        return "flow"
    return "scalar"


class _Doc:
    """A single block-style YAML document kept as lines, with just enough structure to edit it."""

    def __init__(self, text: str) -> None:
        if text.startswith("\ufeff"):
            raise Refusal("the file starts with a byte order mark")
        if "\r\n" in text:
            rest = text.replace("\r\n", "")
            if "\n" in rest or "\r" in rest:
                raise Refusal("mixed line endings (CRLF and LF)")
            self.nl = "\r\n"
        else:
            if "\r" in text:
                raise Refusal("carriage returns without line feeds")
            self.nl = "\n"
        self.final_newline = text.endswith(self.nl)
        body = text[: -len(self.nl)] if self.final_newline else text
        self.lines: list[str] = body.split(self.nl)
        self._validate()

    def text(self) -> str:
        return self.nl.join(self.lines) + (self.nl if self.final_newline else "")

    def _validate(self) -> None:
        first = None
        for n, line in enumerate(self.lines):
            if "\t" in line[: len(line) - len(line.lstrip(" \t"))] and line.strip():
                raise Refusal(f"line {n + 1}: tab character in indentation")
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            if first is None:
                if s.startswith("%") or s == "---":
                    continue
                if s.startswith("--- "):
                    raise Refusal(f"line {n + 1}: content on the document start marker line")
                first = n
                if s[0] in "{[":
                    raise Refusal(
                        "the document looks like JSON or flow-style YAML; only block-style YAML "
                        "is edited"
                    )
            elif s in ("---", "...") or s.startswith("--- "):
                raise Refusal(f"line {n + 1}: more than one YAML document in the file")
        if first is None:
            raise Refusal("the document is empty")

    # structure ------------------------------------------------------------------------------

    def key_match(self, i: int) -> re.Match[str] | None:
        return _KEY_RE.match(self.lines[i])

    def top_keys(self) -> list[tuple[str, int]]:
        keys: list[tuple[str, int]] = []
        seen: set[str] = set()
        sequence_ok = False  # an indentless "- item" may follow a key with an empty value
        for i, line in enumerate(self.lines):
            if not _is_content(line) or _indent(line) != 0:
                continue
            s = line.strip()
            if s == "---" or s.startswith("%"):
                continue
            if sequence_ok and _is_dash(line):
                continue
            m = _KEY_RE.match(line)
            if not m or m.group("dash"):
                raise Refusal(f"line {i + 1}: unexpected top-level content {s!r}")
            key = m.group("key")
            if key in seen:
                raise Refusal(f"duplicate top-level key {key!r}")
            seen.add(key)
            keys.append((key, i))
            sequence_ok = _value_kind(m.group("rest")) == "block"
        return keys

    def top_key(self, key: str) -> int | None:
        for k, i in self.top_keys():
            if k == key:
                return i
        return None

    def top_scalar(self, key: str) -> str | None:
        i = self.top_key(key)
        if i is None:
            return None
        sc = self.key_scalar(i)
        return None if sc is None else sc.value

    def key_scalar(self, i: int) -> _Scalar | None:
        m = self.key_match(i)
        assert m is not None
        return _scalar_at(self.lines[i], m.start("rest"), i)

    def key_kind(self, i: int) -> str:
        m = self.key_match(i)
        assert m is not None
        return _value_kind(m.group("rest"))

    def block_end(self, i: int, col: int) -> int:
        """Index after the last content line of the value of the key on line ``i``.

        ``col`` is the key's column. The value spans deeper-indented lines, plus lines at the
        same column that start a sequence item (YAML's indentless sequences, as kubeadm writes).
        """
        last = i
        for j in range(i + 1, len(self.lines)):
            line = self.lines[j]
            if not _is_content(line):
                continue
            ind = _indent(line)
            if ind > col or (ind == col and _is_dash(line)):
                last = j
                continue
            break
        return last + 1

    def children(
        self, i: int, col: int, what: str, flat: bool = False
    ) -> tuple[int | None, list[tuple[str, int]], int]:
        """The keys of the block mapping under the key on line ``i``: (indent, keys, end)."""
        end = self.block_end(i, col)
        indent: int | None = None
        keys: list[tuple[str, int]] = []
        seen: set[str] = set()
        sequence_ok = False  # an indentless "- item" may follow a key with an empty value
        for j in range(i + 1, end):
            line = self.lines[j]
            if not _is_content(line):
                continue
            ind = _indent(line)
            if indent is None:
                indent = ind
            if ind < indent:
                raise Refusal(f"line {j + 1}: inconsistent indentation in {what}")
            if ind > indent or (sequence_ok and _is_dash(line)):
                if flat:
                    raise Refusal(f"line {j + 1}: unexpected nested value in {what}")
                continue
            m = _KEY_RE.match(line)
            if not m or m.group("dash"):
                raise Refusal(f"line {j + 1}: expected a 'key: value' line in {what}")
            key = m.group("key")
            if key in seen:
                raise Refusal(f"duplicate key {key!r} in {what}")
            seen.add(key)
            keys.append((key, j))
            sequence_ok = _value_kind(m.group("rest")) == "block"
        return indent, keys, end

    def unit(self) -> int:
        """The document's indentation step (the smallest indentation in use), default 2."""
        found = [_indent(line) for line in self.lines if _is_content(line) and _indent(line) > 0]
        return min(found) if found else 2

    def above_comments(self, idx: int, floor: int) -> int:
        """Move an insertion point up over the comment lines directly above line ``idx``."""
        while idx - 1 > floor and self.lines[idx - 1].strip().startswith("#"):
            idx -= 1
        return idx

    def sorted_insert_pos(
        self, siblings: Sequence[tuple[str, int]], new_key: str, floor: int, end: int
    ) -> int:
        """Where a new sibling goes: in order if the siblings are sorted, else at ``end``."""
        keys = [k for k, _ in siblings]
        if keys == sorted(keys):
            for key, idx in siblings:
                if key > new_key:
                    return self.above_comments(idx, floor)
        return end


# --------------------------------------------------------------------------------------------
# Comma-separated lists (--enable-admission-plugins=A,B and --feature-gates=A=true,B=false)
# --------------------------------------------------------------------------------------------


def _comma_entries(raw: str, kv: bool, what: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for token in raw.split(",") if raw else []:
        s = token.strip()
        if not s:
            continue
        if kv:
            if "=" not in s:
                raise Refusal(f"{what}: item {s!r} has no '=value'")
            name, value = s.split("=", 1)
            name = name.strip()
            entry: tuple[str, str | None] = (name, value.strip())
        else:
            name = s
            entry = (name, None)
        if not name or any(ch.isspace() for ch in name):
            raise Refusal(f"{what}: malformed item {s!r}")
        if name in seen:
            raise Refusal(f"{what} lists {name} twice")
        seen.add(name)
        out.append(entry)
    return out


def _comma_apply(raw: str, ops: Sequence[tuple[str, str, str | None]], kv: bool) -> str:
    tokens = raw.split(",") if raw else []

    def find(name: str) -> int:
        for n, token in enumerate(tokens):
            s = token.strip()
            if (s.split("=", 1)[0].strip() if kv else s) == name:
                return n
        raise AssertionError(f"{name} not in list")

    for op, name, value in ops:
        if op == "add":
            filled = [n for n, token in enumerate(tokens) if token.strip()]
            pos = filled[-1] + 1 if filled else 0
            tokens.insert(pos, name if value is None else f"{name}={value}")
        elif op == "remove":
            del tokens[find(name)]
        else:  # set
            assert value is not None
            n = find(name)
            token = tokens[n]
            eq = token.index("=")
            old = token[eq + 1 :]
            lead = old[: len(old) - len(old.lstrip())]
            trail = old[len(old.rstrip()) :]
            tokens[n] = token[: eq + 1] + lead + value + trail
    return ",".join(tokens)


# --------------------------------------------------------------------------------------------
# Settings: one editable list of entries each
# --------------------------------------------------------------------------------------------


def _go_bool(raw: str) -> bool | None:
    if raw in _GO_TRUE:
        return True
    if raw in _GO_FALSE:
        return False
    return None


def _yaml_bool(raw: str) -> bool | None:
    if raw in _YAML_TRUE:
        return True
    if raw in _YAML_FALSE:
        return False
    return None


class _Setting:
    """An editable set of entries (admission plugins, or feature gates with values)."""

    key = ""
    kv = False
    seed: tuple[str, ...] = ()

    def parse_bool(self, raw: str) -> bool | None:
        return _go_bool(raw)

    def read(self, doc: _Doc) -> list[tuple[str, str | None]] | None:
        """The entries as (name, raw value text); None when the setting does not exist."""
        raise NotImplementedError

    def create(self, doc: _Doc, entries: Sequence[tuple[str, str | None]], ctx: _Ctx) -> None:
        raise NotImplementedError

    def modify(
        self, doc: _Doc, ops: Sequence[tuple[str, str, str | None]], st: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    def drop(self, doc: _Doc, st: dict[str, Any]) -> None:
        """Remove the (empty apart from seed entries) setting, or restore its original line."""
        raise NotImplementedError


class _Ctx:
    """Records of enclosing blocks this program created or expanded (kubeadm-config)."""

    def __init__(self, containers: dict[str, dict[str, Any]]) -> None:
        self.containers = containers

    def note(self, name: str, created: bool, original: str | None) -> None:
        self.containers[name] = {"created": created, "original": original}


class _CommaSetting(_Setting):
    def get_raw(self, doc: _Doc) -> str | None:
        raise NotImplementedError

    def set_raw(self, doc: _Doc, raw: str) -> None:
        raise NotImplementedError

    def create_raw(self, doc: _Doc, raw: str, ctx: _Ctx) -> None:
        raise NotImplementedError

    def read(self, doc: _Doc) -> list[tuple[str, str | None]] | None:
        raw = self.get_raw(doc)
        return None if raw is None else _comma_entries(raw, self.kv, self.key)

    def create(self, doc: _Doc, entries: Sequence[tuple[str, str | None]], ctx: _Ctx) -> None:
        raw = ",".join(name if value is None else f"{name}={value}" for name, value in entries)
        self.create_raw(doc, raw, ctx)

    def modify(
        self, doc: _Doc, ops: Sequence[tuple[str, str, str | None]], st: dict[str, Any]
    ) -> None:
        raw = self.get_raw(doc)
        assert raw is not None
        new = _comma_apply(raw, ops, self.kv)
        if new != raw:
            self.set_raw(doc, new)


# apiserver-manifest -------------------------------------------------------------------------


class _Item(NamedTuple):
    idx: int
    sep: str
    scalar: _Scalar


class _CommandList(NamedTuple):
    key_idx: int
    indent: int
    items: list[_Item]


def _is_apiserver_binary(value: str) -> bool:
    return value == "kube-apiserver" or value.endswith("/kube-apiserver")


def _first_item(doc: _Doc, i: int, col: int) -> str | None:
    for j in range(i + 1, doc.block_end(i, col)):
        line = doc.lines[j]
        if not _is_content(line):
            continue
        m = _ITEM_RE.match(line)
        if not m:
            return None
        try:
            sc = _scalar_at(line, len(m.group("indent")) + 1, j)
        except Refusal:
            return None
        return None if sc is None else sc.value
    return None


def _find_apiserver_command(doc: _Doc) -> _CommandList:
    found: list[_CommandList] = []
    for i, line in enumerate(doc.lines):
        m = _KEY_RE.match(line)
        if not m or m.group("key") != "command":
            continue
        col = len(m.group("indent")) + len(m.group("dash") or "")
        kind = _value_kind(m.group("rest"))
        if kind in ("flow", "flow-empty", "scalar"):
            if "kube-apiserver" in m.group("rest"):
                raise Refusal(
                    f"line {i + 1}: the kube-apiserver command is not a block-style list; "
                    "only '- item' lists are edited"
                )
            continue
        first = _first_item(doc, i, col)
        if first is None or not _is_apiserver_binary(first):
            continue
        items: list[_Item] = []
        indent: int | None = None
        for j in range(i + 1, doc.block_end(i, col)):
            item_line = doc.lines[j]
            if not _is_content(item_line):
                continue
            im = _ITEM_RE.match(item_line)
            if indent is None and im:
                indent = len(im.group("indent"))
            if not im or len(im.group("indent")) != indent:
                raise Refusal(
                    f"line {j + 1}: unexpected line in the kube-apiserver command list "
                    "(only one-line '- value' items are supported)"
                )
            sc = _scalar_at(item_line, len(im.group("indent")) + 1, j)
            assert sc is not None
            items.append(_Item(j, im.group("sep"), sc))
        assert indent is not None
        found.append(_CommandList(i, indent, items))
    if not found:
        raise Refusal(
            "no kube-apiserver command list found (expected a container whose 'command' list "
            "starts with kube-apiserver)"
        )
    if len(found) > 1:
        lines = ", ".join(str(c.key_idx + 1) for c in found)
        raise Refusal(f"more than one kube-apiserver command list (lines {lines})")
    return found[0]


class _ApiserverFlag(_CommaSetting):
    def __init__(self, flag: str, kv: bool) -> None:
        self.key = flag
        self.kv = kv
        self.prefix = f"--{flag}="

    def _find(self, doc: _Doc) -> tuple[_CommandList, _Item | None]:
        cmd = _find_apiserver_command(doc)
        hits: list[_Item] = []
        for item in cmd.items[1:]:
            value = item.scalar.value
            if not value.startswith(f"--{self.key}"):
                continue
            rest = value[len(self.key) + 2 :]
            if rest.startswith("="):
                hits.append(item)
            elif rest == "":
                raise Refusal(
                    f"line {item.idx + 1}: --{self.key} without '=value' (value in a separate "
                    "item) is not supported"
                )
            elif rest[0].isspace():
                raise Refusal(f"line {item.idx + 1}: malformed --{self.key} item {value!r}")
        if len(hits) > 1:
            where = ", ".join(str(item.idx + 1) for item in hits)
            raise Refusal(f"--{self.key} appears {len(hits)} times (lines {where})")
        self._check_not_elsewhere(doc, cmd)
        return cmd, (hits[0] if hits else None)

    def _check_not_elsewhere(self, doc: _Doc, cmd: _CommandList) -> None:
        """Refuse a second copy of the flag outside the command list (e.g. in ``args``)."""
        own = {item.idx for item in cmd.items}
        for j, line in enumerate(doc.lines):
            m = _ITEM_RE.match(line)
            if j in own or not m or f"--{self.key}" not in line:
                continue
            try:
                sc = _scalar_at(line, len(m.group("indent")) + 1, j)
            except Refusal:
                continue
            if sc is not None and sc.value.split("=", 1)[0] == f"--{self.key}":
                raise Refusal(
                    f"line {j + 1}: --{self.key} also appears outside the kube-apiserver "
                    "command list"
                )

    def get_raw(self, doc: _Doc) -> str | None:
        _, item = self._find(doc)
        return None if item is None else item.scalar.value[len(self.prefix) :]

    def set_raw(self, doc: _Doc, raw: str) -> None:
        _, item = self._find(doc)
        assert item is not None
        line, sc = doc.lines[item.idx], item.scalar
        doc.lines[item.idx] = (
            line[: sc.start] + _render_scalar(self.prefix + raw, sc.quote) + line[sc.end :]
        )

    def create_raw(self, doc: _Doc, raw: str, ctx: _Ctx) -> None:
        cmd, _ = self._find(doc)
        arg = self.prefix + raw
        flags = [(item.scalar.value, item.idx) for item in cmd.items[1:]]
        last = cmd.items[-1]
        pos = doc.sorted_insert_pos(flags, arg, cmd.items[0].idx, last.idx + 1)
        sep = last.sep
        doc.lines.insert(pos, " " * cmd.indent + "-" + sep + _render_scalar(arg, ""))

    def drop(self, doc: _Doc, st: dict[str, Any]) -> None:
        _, item = self._find(doc)
        if item is not None:
            del doc.lines[item.idx]


# kubelet-config -----------------------------------------------------------------------------


class _KubeletGates(_Setting):
    key = "featureGates"
    kv = True

    def parse_bool(self, raw: str) -> bool | None:
        return _yaml_bool(raw)  # quoted text is a string, never a bool

    def _locate(self, doc: _Doc) -> tuple[int, str, int | None, list[tuple[str, int]], int] | None:
        idx = doc.top_key(self.key)
        if idx is None:
            return None
        kind = doc.key_kind(idx)
        if kind == "flow":
            raise Refusal(
                f"line {idx + 1}: featureGates is a flow-style mapping ({{...}}); only block "
                "style is edited"
            )
        if kind == "scalar":
            raise Refusal(f"line {idx + 1}: featureGates is not a mapping")
        if kind == "flow-empty":
            return idx, kind, None, [], idx + 1
        indent, keys, end = doc.children(idx, 0, "featureGates", flat=True)
        for name, j in keys:
            if not _NAME_RE.match(name):
                raise Refusal(f"line {j + 1}: unexpected feature gate name {name!r}")
        return idx, kind, indent, keys, end

    def _scalar(self, doc: _Doc, j: int, name: str) -> _Scalar:
        sc = doc.key_scalar(j)
        if sc is None:
            raise Refusal(f"line {j + 1}: featureGates.{name} has no value")
        return sc

    def read(self, doc: _Doc) -> list[tuple[str, str | None]] | None:
        loc = self._locate(doc)
        if loc is None:
            return None
        out: list[tuple[str, str | None]] = []
        for name, j in loc[3]:
            sc = self._scalar(doc, j, name)
            out.append((name, doc.lines[j][sc.start : sc.end]))
        return out

    def create(self, doc: _Doc, entries: Sequence[tuple[str, str | None]], ctx: _Ctx) -> None:
        unit = doc.unit()
        top = doc.top_keys()
        pos = doc.sorted_insert_pos(top, self.key, -1, len(doc.lines))
        block = [f"{self.key}:"] + [f"{' ' * unit}{name}: {value}" for name, value in entries]
        doc.lines[pos:pos] = block

    def modify(
        self, doc: _Doc, ops: Sequence[tuple[str, str, str | None]], st: dict[str, Any]
    ) -> None:
        for op, name, value in ops:
            loc = self._locate(doc)
            assert loc is not None
            idx, kind, indent, keys, end = loc
            where = dict(keys)
            if op == "remove":
                del doc.lines[where[name]]
            elif op == "set":
                assert value is not None
                j = where[name]
                sc = self._scalar(doc, j, name)
                line = doc.lines[j]
                doc.lines[j] = line[: sc.start] + value + line[sc.end :]
            else:
                if kind == "flow-empty":
                    if not st.get("created") and st.get("original") is None:
                        st["original"] = doc.lines[idx]
                    doc.lines[idx] = f"{self.key}:"
                    end = idx + 1
                pos = doc.sorted_insert_pos(keys, name, idx, end) if keys else idx + 1
                ind = indent if indent is not None else doc.unit()
                doc.lines.insert(pos, f"{' ' * ind}{name}: {value}")

    def drop(self, doc: _Doc, st: dict[str, Any]) -> None:
        loc = self._locate(doc)
        if loc is None:
            return
        idx = loc[0]
        if st.get("created"):
            del doc.lines[idx]
        elif st.get("original") is not None:
            doc.lines[idx] = st["original"]


# kubeadm-config -----------------------------------------------------------------------------

KUBEADM_V1BETA3 = "kubeadm.k8s.io/v1beta3"
KUBEADM_V1BETA4 = "kubeadm.k8s.io/v1beta4"


class _ArgEntry(NamedTuple):
    lines: tuple[int, ...]  # every line of the entry (one for a map entry, two for a list item)
    value_idx: int
    scalar: _Scalar


def _expect_block(doc: _Doc, idx: int, what: str) -> str:
    kind = doc.key_kind(idx)
    if kind in ("flow", "scalar"):
        raise Refusal(f"line {idx + 1}: {what} has an unsupported value; expected a block")
    return kind


class _KubeadmArg(_CommaSetting):
    """apiServer.extraArgs[<arg>] of a ClusterConfiguration."""

    def __init__(self, arg: str, kv: bool, seed: tuple[str, ...] = ()) -> None:
        self.key = arg
        self.kv = kv
        self.seed = seed

    @staticmethod
    def _list_style(doc: _Doc) -> bool:
        return doc.top_scalar("apiVersion") == KUBEADM_V1BETA4

    @staticmethod
    def _api_server(doc: _Doc) -> tuple[int, int | None, list[tuple[str, int]], int] | None:
        idx = doc.top_key("apiServer")
        if idx is None or _expect_block(doc, idx, "apiServer") == "flow-empty":
            return None
        indent, keys, end = doc.children(idx, 0, "apiServer")
        return idx, indent, keys, end

    def _extra_args(self, doc: _Doc) -> tuple[int, int, dict[str, list[_ArgEntry]], int] | None:
        """(line, key column, {arg: entries}, block end) of apiServer.extraArgs, if a block."""
        api = self._api_server(doc)
        if api is None:
            return None
        idx = dict(api[2]).get("extraArgs")
        if idx is None or _expect_block(doc, idx, "apiServer.extraArgs") == "flow-empty":
            return None
        col = _indent(doc.lines[idx])
        args: dict[str, list[_ArgEntry]] = {}
        if self._list_style(doc):
            end = self._list_entries(doc, idx, col, args)
        else:
            first = next(
                (j for j in range(idx + 1, len(doc.lines)) if _is_content(doc.lines[j])), None
            )
            if first is not None and _is_dash(doc.lines[first]):
                raise Refusal(
                    f"line {first + 1}: apiServer.extraArgs must be a mapping in {KUBEADM_V1BETA3}"
                )
            _, keys, end = doc.children(idx, col, "apiServer.extraArgs", flat=True)
            for name, j in keys:
                sc = doc.key_scalar(j)
                if sc is None:
                    raise Refusal(f"line {j + 1}: apiServer.extraArgs.{name} has no value")
                args.setdefault(name, []).append(_ArgEntry((j,), j, sc))
        return idx, col, args, end

    @staticmethod
    def _list_entries(doc: _Doc, idx: int, col: int, args: dict[str, list[_ArgEntry]]) -> int:
        end = doc.block_end(idx, col)
        items: list[dict[str, Any]] = []
        item_indent: int | None = None
        for j in range(idx + 1, end):
            line = doc.lines[j]
            if not _is_content(line):
                continue
            m = _ITEM_RE.match(line)
            if m and (item_indent is None or len(m.group("indent")) == item_indent):
                item_indent = len(m.group("indent"))
                key_col = item_indent + 1 + len(m.group("sep"))
                items.append({"lines": [j], "key_col": key_col, "keys": {}})
                body = " " * key_col + m.group("rest")
            elif items and _indent(line) == items[-1]["key_col"]:
                items[-1]["lines"].append(j)
                body = line
            else:
                raise Refusal(
                    f"line {j + 1}: apiServer.extraArgs must be a list of name/value items in "
                    f"{KUBEADM_V1BETA4}"
                )
            km = _KEY_RE.match(body)
            if not km or km.group("dash") or km.group("key") not in ("name", "value"):
                raise Refusal(f"line {j + 1}: unexpected line in an apiServer.extraArgs item")
            key = km.group("key")
            if key in items[-1]["keys"]:
                raise Refusal(f"line {j + 1}: apiServer.extraArgs item repeats {key!r}")
            sc = _scalar_at(line, len(line) - len(body) + km.start("rest"), j)
            items[-1]["keys"][key] = (j, sc)
        for item in items:
            first = item["lines"][0]
            if "name" not in item["keys"] or item["keys"]["name"][1] is None:
                raise Refusal(f"line {first + 1}: apiServer.extraArgs item without a name")
            name = item["keys"]["name"][1].value
            if "value" not in item["keys"] or item["keys"]["value"][1] is None:
                value_entry = None
            else:
                value_entry = item["keys"]["value"]
            if value_entry is None:
                args.setdefault(name, [])
                args[name].append(_ArgEntry(tuple(item["lines"]), -1, _Scalar(0, 0, "", "")))
            else:
                j, sc = value_entry
                args.setdefault(name, []).append(_ArgEntry(tuple(item["lines"]), j, sc))
        return end

    def _entry(self, doc: _Doc) -> _ArgEntry | None:
        ea = self._extra_args(doc)
        if ea is None:
            return None
        entries = ea[2].get(self.key, [])
        if len(entries) > 1:
            where = ", ".join(str(e.lines[0] + 1) for e in entries)
            raise Refusal(
                f"apiServer.extraArgs sets {self.key} {len(entries)} times (lines {where})"
            )
        if not entries:
            return None
        if entries[0].value_idx < 0:
            raise Refusal(
                f"line {entries[0].lines[0] + 1}: apiServer.extraArgs item {self.key} has no value"
            )
        return entries[0]

    def get_raw(self, doc: _Doc) -> str | None:
        entry = self._entry(doc)
        return None if entry is None else entry.scalar.value

    def set_raw(self, doc: _Doc, raw: str) -> None:
        entry = self._entry(doc)
        assert entry is not None
        line, sc = doc.lines[entry.value_idx], entry.scalar
        rendered = _render_scalar(raw, sc.quote)
        doc.lines[entry.value_idx] = line[: sc.start] + rendered + line[sc.end :]

    def _ensure_api_server(self, doc: _Doc, ctx: _Ctx) -> int:
        idx = doc.top_key("apiServer")
        if idx is None:
            pos = doc.sorted_insert_pos(doc.top_keys(), "apiServer", -1, len(doc.lines))
            doc.lines.insert(pos, "apiServer:")
            ctx.note("apiServer", True, None)
            return pos
        if _expect_block(doc, idx, "apiServer") == "flow-empty":
            ctx.note("apiServer", False, doc.lines[idx])
            doc.lines[idx] = "apiServer:"
        return idx

    def _ensure_extra_args(self, doc: _Doc, ctx: _Ctx) -> int:
        api_idx = self._ensure_api_server(doc, ctx)
        api = self._api_server(doc)
        assert api is not None
        _, indent, keys, end = api
        col = indent if indent is not None else doc.unit()
        idx = dict(keys).get("extraArgs")
        if idx is None:
            pos = doc.sorted_insert_pos(keys, "extraArgs", api_idx, end) if keys else api_idx + 1
            doc.lines.insert(pos, " " * col + "extraArgs:")
            ctx.note("apiServer.extraArgs", True, None)
            return pos
        if _expect_block(doc, idx, "apiServer.extraArgs") == "flow-empty":
            ctx.note("apiServer.extraArgs", False, doc.lines[idx])
            doc.lines[idx] = " " * _indent(doc.lines[idx]) + "extraArgs:"
        return idx

    def create_raw(self, doc: _Doc, raw: str, ctx: _Ctx) -> None:
        self._ensure_extra_args(doc, ctx)
        ea = self._extra_args(doc)
        assert ea is not None
        idx, col, args, end = ea
        value = _render_scalar(raw, "")
        siblings = sorted(((name, es[0].lines[0]) for name, es in args.items()), key=lambda s: s[1])
        if self._list_style(doc):
            indent = col
            for j in range(idx + 1, end):
                m = _ITEM_RE.match(doc.lines[j])
                if m:
                    indent = len(m.group("indent"))
                    break
            new = [f"{' ' * indent}- name: {self.key}", f"{' ' * (indent + 2)}value: {value}"]
        else:
            indent = col + doc.unit()
            for _, entries in args.items():
                indent = _indent(doc.lines[entries[0].lines[0]])
                break
            new = [f"{' ' * indent}{self.key}: {value}"]
        pos = doc.sorted_insert_pos(siblings, self.key, idx, end) if siblings else idx + 1
        doc.lines[pos:pos] = new

    def drop(self, doc: _Doc, st: dict[str, Any]) -> None:
        entry = self._entry(doc)
        if entry is not None:
            for j in sorted(entry.lines, reverse=True):
                del doc.lines[j]


def _cleanup_kubeadm_blocks(doc: _Doc, containers: dict[str, dict[str, Any]]) -> None:
    """Take out apiServer / apiServer.extraArgs blocks this program created once they are empty."""
    for name in ("apiServer.extraArgs", "apiServer"):
        record = containers.get(name)
        if record is None:
            continue
        idx = doc.top_key("apiServer")
        if idx is not None and name == "apiServer.extraArgs":
            api = _KubeadmArg._api_server(doc)
            idx = None if api is None else dict(api[2]).get("extraArgs")
        if idx is None:
            del containers[name]
            continue
        if doc.key_kind(idx) != "block":
            del containers[name]  # someone rewrote it; it is no longer ours
            continue
        col = _indent(doc.lines[idx])
        end = doc.block_end(idx, col)
        if end > idx + 1:
            continue  # still has content
        if record.get("created"):
            del doc.lines[idx]
        elif record.get("original") is not None:
            doc.lines[idx] = record["original"]
        del containers[name]


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


def _check_kind(doc: _Doc, kind: str, api_versions: Callable[[str], bool], what: str) -> None:
    actual = doc.top_scalar("kind")
    if actual != kind:
        raise Refusal(f"not a {what} (kind: {actual or 'missing'})")
    api_version = doc.top_scalar("apiVersion") or ""
    if not api_versions(api_version):
        raise Refusal(f"unsupported apiVersion {api_version or 'missing'} for {kind}")


def _settings_for(target: str, doc: _Doc) -> list[_Setting]:
    if target == "apiserver-manifest":
        _check_kind(doc, "Pod", lambda v: v == "v1", "Pod manifest")
        _find_apiserver_command(doc)
        return [
            _ApiserverFlag("enable-admission-plugins", kv=False),
            _ApiserverFlag("feature-gates", kv=True),
        ]
    if target == "kubelet-config":
        _check_kind(
            doc,
            "KubeletConfiguration",
            lambda v: v.startswith("kubelet.config.k8s.io/"),
            "KubeletConfiguration",
        )
        return [_KubeletGates()]
    if target == "kubeadm-config":
        _check_kind(
            doc,
            "ClusterConfiguration",
            lambda v: v in (KUBEADM_V1BETA3, KUBEADM_V1BETA4),
            "kubeadm ClusterConfiguration",
        )
        # Without the arg, kubeadm generates --enable-admission-plugins=NodeRestriction; once the
        # arg exists it replaces that default, so a new arg must start with NodeRestriction.
        return [
            _KubeadmArg("enable-admission-plugins", kv=False, seed=("NodeRestriction",)),
            _KubeadmArg("feature-gates", kv=True),
        ]
    raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")


# --------------------------------------------------------------------------------------------
# Planning: what to add, change and remove, given the file, the configuration and the state
# --------------------------------------------------------------------------------------------


def _empty_setting_state() -> dict[str, Any]:
    return {"created": False, "original": None, "seeded": [], "added": {}, "changed": {}}


def _label(key: str, name: str, value: str | None) -> str:
    return f"{key}:{name}" if value is None else f"{key}:{name}={value}"


def _same(setting: _Setting, raw: str | None, value: str | None) -> bool:
    if value is None:
        return True
    if raw is None:
        return False
    current = setting.parse_bool(raw)
    return current is not None and current == (value == "true")


def _plan(
    setting: _Setting,
    current: Mapping[str, str | None],
    desired: Mapping[str, str | None],
    st: dict[str, Any],
    report: _Report,
) -> list[tuple[str, str, str | None]]:
    ops: list[tuple[str, str, str | None]] = []
    added: dict[str, str | None] = st["added"]
    changed: dict[str, dict[str, Any]] = st["changed"]
    key = setting.key

    # Entries this program owns that are no longer configured: take them out again.
    for name in list(added):
        if name in desired:
            continue
        if name in current and _same(setting, current[name], added[name]):
            ops.append(("remove", name, None))
            report.removed.append(_label(key, name, current[name]))
        elif name in current:
            report.warnings.append(
                f"{key}: {name} was changed by someone else after it was added; leaving it"
            )
        del added[name]
    for name in list(changed):
        if name in desired:
            continue
        old, ours = changed[name]["old"], changed[name]["new"]
        if name in current and _same(setting, current[name], ours):
            ops.append(("set", name, old))
            report.changed_values[f"{key}:{name}"] = {"old": str(current[name]), "new": old}
        elif name in current:
            report.warnings.append(
                f"{key}: {name} was changed by someone else after it was set; leaving it"
            )
        del changed[name]

    # Configured entries.
    for name, value in desired.items():
        if name not in current:
            ops.append(("add", name, value))
            added[name] = value
            changed.pop(name, None)
            report.added.append(_label(key, name, value))
        elif _same(setting, current[name], value):
            if name in added:
                added[name] = value
        else:
            assert value is not None
            raw = str(current[name])
            ops.append(("set", name, value))
            if name in added:
                added[name] = value
            elif name in changed:
                changed[name]["new"] = value
            else:
                changed[name] = {"old": raw, "new": value}
            report.changed_values[f"{key}:{name}"] = {"old": raw, "new": value}
    return ops


def _execute(
    doc: _Doc,
    setting: _Setting,
    ops: Sequence[tuple[str, str, str | None]],
    st: dict[str, Any],
    ctx: _Ctx,
) -> None:
    if not ops:
        return
    # removals and value changes first, then additions
    ordered = [op for op in ops if op[0] != "add"] + [op for op in ops if op[0] == "add"]
    if setting.read(doc) is None:
        adds = [(name, value) for op, name, value in ordered if op == "add"]
        if not adds:
            return
        names = {name for name, _ in adds}
        seeded = [s for s in setting.seed if s not in names]
        setting.create(doc, [(s, None) for s in seeded] + adds, ctx)
        st["created"], st["original"], st["seeded"] = True, None, seeded
        return
    setting.modify(doc, ordered, st)


def _maybe_drop(doc: _Doc, setting: _Setting, st: dict[str, Any]) -> None:
    """Remove a setting this program created (or expanded) once only its seed entries remain."""
    if not st.get("created") and st.get("original") is None:
        return
    entries = setting.read(doc)
    if entries is not None:
        names = [name for name, _ in entries]
        seeded = list(st.get("seeded") or [])
        if any(s not in names for s in seeded) or any(n not in seeded for n in names):
            return
        setting.drop(doc, st)
    st["created"], st["original"], st["seeded"] = False, None, []


def _normalise_state(target: str, state: Mapping[str, Any] | None) -> dict[str, Any]:
    st: dict[str, Any] = copy.deepcopy(dict(state)) if state else {}
    if st and st.get("schema") != STATE_SCHEMA:
        raise Refusal(f"state has schema {st.get('schema')!r}; this program writes {STATE_SCHEMA}")
    if st.get("target", target) != target:
        raise Refusal(f"state belongs to target {st.get('target')!r}, not {target!r}")
    st["schema"] = STATE_SCHEMA
    st["target"] = target
    st.setdefault("settings", {})
    st.setdefault("containers", {})
    for value in st["settings"].values():
        for k, v in _empty_setting_state().items():
            value.setdefault(k, v)
    return st


def _normalise_plugins(plugins: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in plugins:
        if not _NAME_RE.match(name):
            raise ValueError(f"not an admission plugin name: {name!r}")
        out[name] = None
    return out


def _normalise_gates(gates: Mapping[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, value in gates.items():
        if not _NAME_RE.match(name):
            raise ValueError(f"not a feature gate name: {name!r}")
        out[name] = _gate_value(name, value)
    return out


def _edit(
    target: str,
    text: str,
    desired: Mapping[str, Mapping[str, str | None]],
    state: Mapping[str, Any] | None,
    report: _Report,
) -> tuple[str, dict[str, Any]]:
    doc = _Doc(text)
    settings = _settings_for(target, doc)
    st = _normalise_state(target, state)
    ctx = _Ctx(st["containers"])
    for setting in settings:
        sst = st["settings"].setdefault(setting.key, _empty_setting_state())
        current_entries = setting.read(doc) or []
        current = dict(current_entries)
        ops = _plan(setting, current, desired.get(setting.key, {}), sst, report)
        _execute(doc, setting, ops, sst, ctx)
        _maybe_drop(doc, setting, sst)
    if target == "kubeadm-config":
        _cleanup_kubeadm_blocks(doc, st["containers"])
    new_text = doc.text()
    _Doc(new_text)  # the result must still be a document this program accepts
    return new_text, st


def _desired_for(
    target: str, admission_plugins: Iterable[str], gates: Mapping[str, Any]
) -> dict[str, dict[str, str | None]]:
    plugins = _normalise_plugins(admission_plugins)
    normal = _normalise_gates(gates)
    if target == "kubelet-config":
        if plugins:
            raise ValueError("kubelet-config takes no admission plugins")
        return {"featureGates": normal}
    return {"enable-admission-plugins": plugins, "feature-gates": normal}


def apply_edit(
    target: str,
    text: str,
    admission_plugins: Iterable[str] = (),
    feature_gates: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    kubernetes_version: str | None = None,
) -> EditResult:
    """Merge the configuration into ``text`` (pure: no I/O).

    ``state`` is the dict returned by the previous apply (or None); the returned state must be
    kept and passed to the next apply or to revert_edit. Raises Refusal for input that cannot be
    edited confidently and ValueError for bad arguments.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    report = _Report()
    gates, report.warnings = filter_gates(dict(feature_gates or {}), kubernetes_version)
    desired = _desired_for(target, admission_plugins, gates)
    new_text, st = _edit(target, text, desired, state, report)
    return EditResult(
        new_text,
        st,
        new_text != text,
        report.added,
        report.removed,
        report.changed_values,
        report.warnings,
    )


def revert_edit(target: str, text: str, state: Mapping[str, Any] | None) -> EditResult:
    """Take out exactly what the applies recorded in ``state`` did (pure: no I/O)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    report = _Report()
    new_text, _ = _edit(target, text, {}, state, report)
    return EditResult(
        new_text,
        None,
        new_text != text,
        report.added,
        report.removed,
        report.changed_values,
        report.warnings,
    )


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def backup_path(backup_dir: str, path: str) -> str:
    """Where the pre-edit copy of ``path`` lives: ``<backup_dir>/<path, / -> _>.orig``."""
    flat = os.path.abspath(path).strip("/").replace("/", "_")
    return os.path.join(backup_dir, flat + ".orig")


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(f"not valid UTF-8 ({exc})") from exc


def atomic_write(path: str, data: bytes, default_mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, keeping its mode and owner.

    The temporary file is ``.<name>.<random>.gpu-cluster-tmp`` in the same directory: the leading
    dot keeps the kubelet from starting it as a static pod, and the suffix is not .yaml/.json.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".gpu-cluster-tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            current = os.stat(path)
        except FileNotFoundError:
            os.chmod(tmp, default_mode)
        else:
            os.chmod(tmp, stat.S_IMODE(current.st_mode))
            mine = os.stat(tmp)
            if (mine.st_uid, mine.st_gid) != (current.st_uid, current.st_gid):
                with contextlib.suppress(OSError):  # not root: the file keeps our owner
                    os.chown(tmp, current.st_uid, current.st_gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _load_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise Refusal(f"state file {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise Refusal(f"state file {path} does not hold a JSON object")
    return data


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _split_values(values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for value in values:
        out.extend(part.strip() for part in value.split(",") if part.strip())
    return out


def parse_plugins_arg(values: Sequence[str]) -> list[str]:
    """``["A,B", "C"]`` -> ``["A", "B", "C"]`` (duplicates dropped, order kept)."""
    out: list[str] = []
    for name in _split_values(values):
        if not _NAME_RE.match(name):
            raise UsageError(f"--admission-plugins: not a plugin name: {name!r}")
        if name not in out:
            out.append(name)
    return out


def parse_gates_arg(values: Sequence[str]) -> dict[str, str]:
    """``["A=true,B=false"]`` -> ``{"A": "true", "B": "false"}``."""
    out: dict[str, str] = {}
    for token in _split_values(values):
        name, sep, value = token.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _NAME_RE.match(name):
            raise UsageError(f"--feature-gates: expected Name=true|false, got {token!r}")
        try:
            normal = _gate_value(name, value)
        except ValueError as exc:
            raise UsageError(f"--feature-gates: {exc}") from exc
        if out.get(name, normal) != normal:
            raise UsageError(f"--feature-gates: {name} is given as both true and false")
        out[name] = normal
    return out


def build_argv(
    target: str,
    action: str,
    *,
    file: str,
    state: str,
    admission_plugins: Sequence[str] = (),
    feature_gates: Mapping[str, Any] | None = None,
    kubernetes_version: str | None = None,
    backup_dir: str | None = None,
    out: str | None = None,
    dry_run: bool = False,
) -> list[str]:
    """The arguments (after the script path) for one run; quote them with shlex.join."""
    if target not in TARGETS or action not in ACTIONS:
        raise ValueError(f"unknown target/action {target!r} {action!r}")
    argv = [target, action, "--file", file, "--state", state]
    if action == "apply":
        if admission_plugins:
            argv += ["--admission-plugins", ",".join(admission_plugins)]
        if feature_gates:
            argv += ["--feature-gates", format_gates(feature_gates)]
        if kubernetes_version:
            argv += ["--kubernetes-version", kubernetes_version]
    if backup_dir:
        argv += ["--backup-dir", backup_dir]
    if out:
        argv += ["--out", out]
    if dry_run:
        argv.append("--dry-run")
    return argv


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kube_flags_edit.py",
        description="Merge admission plugins and feature gates into kubeadm-managed files, "
        "and take them out again.",
        epilog="Exit status: 0 ok (changed or not), 2 refused (unparseable file or bad "
        "arguments; nothing written), 1 other error.",
    )
    p.add_argument("target", choices=TARGETS)
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("--file", required=True, help="the file to edit (read-only with --out)")
    p.add_argument("--state", required=True, help="JSON state file recording this program's edits")
    p.add_argument(
        "--admission-plugins",
        action="append",
        default=[],
        metavar="A,B",
        help="admission plugins to enable (apply; apiserver-manifest and kubeadm-config)",
    )
    p.add_argument(
        "--feature-gates",
        action="append",
        default=[],
        metavar="A=true,B=false",
        help="feature gates to set (apply)",
    )
    p.add_argument(
        "--kubernetes-version",
        metavar="v1.34.2",
        help="leave out gates that are locked, removed or unknown in this version (apply)",
    )
    p.add_argument(
        "--backup-dir",
        default=DEFAULT_BACKUP_DIR,
        help=f"where the pre-edit copy goes (default {DEFAULT_BACKUP_DIR})",
    )
    p.add_argument(
        "--out",
        metavar="PATH|-",
        help="write the result here instead of editing --file; '-' prints it to stdout",
    )
    p.add_argument("--dry-run", action="store_true", help="print a diff to stderr, write nothing")
    return p


def _check_locations(args: argparse.Namespace, path: str) -> None:
    if args.target != "apiserver-manifest":
        return
    manifests = os.path.dirname(path)
    if _same_dir(args.backup_dir, manifests):
        raise UsageError(
            f"--backup-dir {args.backup_dir} is the static pod manifests directory; the kubelet "
            "would start every file in it whose name does not begin with a dot"
        )
    if _same_dir(os.path.dirname(os.path.abspath(args.state)), manifests):
        raise UsageError(
            f"--state {args.state} is in the static pod manifests directory; the kubelet would "
            "try to start it as a pod"
        )


def _run(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    path = os.path.abspath(args.file)
    state_path = os.path.abspath(args.state)
    out = args.out
    in_place = out is None or (out != "-" and os.path.abspath(out) == path)
    _check_locations(args, path)
    backup_dir = os.path.abspath(args.backup_dir)
    backup = backup_path(backup_dir, path)
    if args.action == "apply":
        plugins = parse_plugins_arg(args.admission_plugins)
        gates = parse_gates_arg(args.feature_gates)
        if args.target == "kubelet-config" and plugins:
            raise UsageError("kubelet-config takes no --admission-plugins")
        if args.kubernetes_version:
            try:
                parse_version(args.kubernetes_version)
            except ValueError as exc:
                raise UsageError(f"--kubernetes-version: {exc}") from exc
    state = _load_state(state_path)
    # An in-place edit must use the state of that same file. With --out the input is usually a
    # throwaway extract (the ConfigMap's ClusterConfiguration), so its path is not checked.
    if in_place and state is not None and state.get("in_place") and state.get("file") != path:
        raise Refusal(f"state file {state_path} records edits of {state.get('file')}, not {path}")
    if args.action == "revert" and state is None:
        summary["warnings"].append(f"no state file {state_path}; nothing to revert")
        if not args.dry_run and out not in (None, "-") and not in_place:
            atomic_write(out, _read_text(path).encode("utf-8"))
        elif out == "-":
            summary["_document"] = _read_text(path)
        return
    text = _read_text(path)
    if args.action == "apply":
        result = apply_edit(
            args.target, text, plugins, gates, state, args.kubernetes_version or None
        )
    else:
        result = revert_edit(args.target, text, state)
    summary.update(
        changed=result.changed,
        added=result.added,
        removed=result.removed,
        changed_values=result.changed_values,
    )
    summary["warnings"].extend(result.warnings)
    if out == "-":
        summary["_document"] = result.text
    if args.dry_run:
        diff = difflib.unified_diff(
            text.splitlines(True), result.text.splitlines(True), path, f"{path} (edited)"
        )
        sys.stderr.write("".join(diff))
        return

    new_state: dict[str, Any] | None = None
    if result.state is not None:
        new_state = dict(result.state)
        new_state["file"] = path
        new_state["in_place"] = in_place
        new_state["backup"] = (state or {}).get("backup")
    if result.changed and in_place and args.action == "apply":
        if not os.path.exists(backup):
            os.makedirs(backup_dir, mode=0o700, exist_ok=True)
            atomic_write(backup, text.encode("utf-8"), default_mode=0o600)
        assert new_state is not None
        new_state["backup"] = backup
    # The state goes first: if the file write then fails, the next run still knows what it owns.
    if new_state is not None and new_state != state:
        os.makedirs(os.path.dirname(state_path), exist_ok=True)
        data = json.dumps(new_state, indent=2, sort_keys=True) + "\n"
        atomic_write(state_path, data.encode("utf-8"), default_mode=0o600)
    if out not in (None, "-") and not in_place:
        atomic_write(out, result.text.encode("utf-8"))
    elif in_place and result.changed:
        atomic_write(path, result.text.encode("utf-8"))
    summary["backup"] = (new_state or state or {}).get("backup")
    if args.action == "revert":
        os.unlink(state_path)
        recorded = (state or {}).get("backup")
        if in_place and recorded and os.path.exists(recorded):
            if _read_text(recorded) == result.text:
                os.unlink(recorded)
                summary["backup"] = None
            else:
                summary["warnings"].append(
                    f"the reverted file differs from the pre-edit copy {recorded} (edited "
                    "meanwhile); the copy is kept"
                )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    summary: dict[str, Any] = {
        "file": None,
        "target": None,
        "action": None,
        "changed": False,
        "added": [],
        "removed": [],
        "changed_values": {},
        "warnings": [],
    }
    code = EXIT_OK
    args: argparse.Namespace | None = None
    try:
        args = _parser().parse_args(args_list)
        summary.update(
            file=os.path.abspath(args.file),
            target=args.target,
            action=args.action,
            state=os.path.abspath(args.state),
            dry_run=bool(args.dry_run),
        )
        _run(args, summary)
    except (Refusal, UsageError) as exc:
        where = summary["file"] or "(no file)"
        kind = "refusing to edit" if isinstance(exc, Refusal) else "bad arguments for"
        summary["error"] = f"{kind} {where}: {exc}"
        code = EXIT_REFUSED
    except Exception as exc:  # anything else is reported as a plain error
        summary["error"] = f"failed on {summary['file'] or '(no file)'}: {exc}"
        code = EXIT_ERROR
    for warning in summary["warnings"]:
        sys.stderr.write(f"{PROG}: warning: {warning}\n")
    if "error" in summary:
        sys.stderr.write(f"{PROG}: {summary['error']}\n")
        summary["exit_code"] = code
    document = summary.pop("_document", None)
    line = json.dumps(summary, sort_keys=False)
    if document is not None and code == EXIT_OK:
        sys.stdout.write(document)
        sys.stdout.flush()
        sys.stderr.write(line + "\n")
    else:
        sys.stdout.write(line + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
