"""Stand-in for pulumi-resource-command (SDK pulumi_command): remote.Command over OpenSSH's `ssh`.

The lifecycle is the real provider's: create runs `create`; any other input change updates in
place and runs `update`, or `create` again when `update` is unset; a change of `triggers`
replaces (delete, then create when the program asks for delete_before_replace); delete runs
`delete`. A non-zero exit fails the operation with the exit status and the command's stderr.
Outputs are the inputs (with connection defaults: port 22, user root) plus `stdout` and
`stderr`, trailing newline trimmed; `connection` is a secret, as is any secret input.

The command runs as `ssh ... -p <port> -l <user> <host> -- <command>`, with `-F none` (no ssh
config) and BatchMode. With `hostKey`, only that key is accepted (a known_hosts file holding
just it, StrictHostKeyChecking=yes); without, any host key is, as with the real provider. A
`privateKey` is written, mode 0600, to a temporary directory removed after the run, and is the
only identity offered; without one, the agent at `agentSocketPath` or $SSH_AUTH_SOCK is used.

Record mode: when $GPU_CLUSTER_COMMAND_RECORD names a file, nothing runs and each command that
would run appends one JSON line {"op", "name", "host", "port", "command"} to it ("op" is
create, update or delete; "name" the resource name). stdout and stderr are then empty.

What it does NOT do, unlike the real provider:
- only remote.Command: no local.Command, CopyToRemote, CopyFile, no functions (runOutput);
- no Read: refresh keeps the state as it is, and import is not possible;
- refused by check: password and privateKeyPassword authentication, ssh proxies (jump
  hosts), `environment` (the real provider sends it with the SSH "env" request);
- `addPreviousOutputInEnv` is accepted but PULUMI_COMMAND_STDOUT/STDERR are not sent;
- `logging` is accepted but stdout and stderr are never streamed to the engine's log;
- one connection attempt (`dialErrorLimit` is ignored; `perDialTimeout` is ssh's
  ConnectTimeout), and no custom timeouts for the command itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pulumi.provider.experimental.property_value import PropertyValue
from pulumi.provider.experimental.provider import (
    CheckFailure,
    CheckRequest,
    CheckResponse,
    CreateRequest,
    CreateResponse,
    DeleteRequest,
    DiffRequest,
    DiffResponse,
    Provider,
    UpdateRequest,
    UpdateResponse,
)

from tools.plugins import changed_inputs, diff_response, plain, serve, unknown, wrap

RECORD_ENV = "GPU_CLUSTER_COMMAND_RECORD"
TOKEN = "command:remote:Command"

_INPUTS = frozenset(
    {
        "connection",
        "create",
        "update",
        "delete",
        "triggers",
        "stdin",
        "logging",
        "addPreviousOutputInEnv",
    }
)
_CONNECTION_DEFAULTS = {"port": 22, "user": "root", "dialErrorLimit": 10, "perDialTimeout": 15}
_CONNECTION = frozenset({"host", "privateKey", "hostKey", "agentSocketPath", *_CONNECTION_DEFAULTS})
_OUTPUTS = ("stdout", "stderr")


def _unsupported(
    values: Mapping[str, PropertyValue], known: frozenset[str], path: str
) -> list[CheckFailure]:
    return [
        CheckFailure(
            f"{path}{k}", f"{path}{k} is not supported by this stand-in of the command provider"
        )
        for k, v in values.items()
        if k not in known and plain(v) not in (None, False, "", [], {})
    ]


def _ssh_argv(connection: Mapping[str, Any], command: str, workdir: Path) -> list[str]:
    host, port = connection["host"], int(connection["port"])
    options = {
        "BatchMode": "yes",
        "ConnectTimeout": str(int(connection["perDialTimeout"])),
        "GlobalKnownHostsFile": "/dev/null",
        # Keeps ssh's own notices (e.g. "Permanently added ...") out of the command's stderr.
        "LogLevel": "ERROR",
    }
    if connection.get("hostKey"):
        known_hosts = workdir / "known_hosts"
        entry = host if port == 22 else f"[{host}]:{port}"
        known_hosts.write_text(f"{entry} {connection['hostKey'].strip()}\n")
        options |= {"StrictHostKeyChecking": "yes", "UserKnownHostsFile": str(known_hosts)}
    else:
        options |= {"StrictHostKeyChecking": "no", "UserKnownHostsFile": "/dev/null"}
    if connection.get("privateKey"):
        key = workdir / "identity"
        key.touch(mode=0o600)  # before the key is written
        key.write_text(connection["privateKey"].rstrip("\n") + "\n")
        options |= {"IdentityFile": str(key), "IdentitiesOnly": "yes", "IdentityAgent": "none"}
    elif connection.get("agentSocketPath"):
        options["IdentityAgent"] = connection["agentSocketPath"]
    flags = [arg for name, value in options.items() for arg in ("-o", f"{name}={value}")]
    user = connection["user"]
    return ["ssh", "-F", "none", *flags, "-p", str(port), "-l", user, host, "--", command]


def _ssh(connection: Mapping[str, Any], command: str, stdin: str | None) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="pulumi-command-") as workdir:
        argv = _ssh_argv(connection, command, Path(workdir))
        result = subprocess.run(argv, input=stdin or "", capture_output=True, text=True)
    if result.returncode != 0:
        where = f"{connection['user']}@{connection['host']}:{int(connection['port'])}"
        raise RuntimeError(
            f"{where}: process exited with status {result.returncode}: running {command!r}:\n"
            f"{result.stderr.rstrip()}"
        )
    return result.stdout.removesuffix("\n"), result.stderr.removesuffix("\n")


async def _run(op: str, name: str, inputs: Mapping[str, Any], command: str) -> tuple[str, str]:
    """Run `command` on the connection's host, or record it (RECORD_ENV): (stdout, stderr)."""
    connection = inputs["connection"]
    record = os.environ.get(RECORD_ENV)
    if record:
        line = {
            "op": op,
            "name": name,
            "host": connection["host"],
            "port": int(connection["port"]),
            "command": command,
        }
        with open(record, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")
        return "", ""
    return await asyncio.to_thread(_ssh, connection, command, inputs.get("stdin"))


def _state(
    inputs: Mapping[str, PropertyValue], stdout: PropertyValue, stderr: PropertyValue
) -> dict[str, PropertyValue]:
    return {
        **inputs,
        "connection": inputs["connection"].with_secret(True),
        "stdout": stdout,
        "stderr": stderr,
    }


class CommandProvider(Provider):
    """remote.Command."""

    async def check(self, request: CheckRequest) -> CheckResponse:
        token = request.type.rpartition("$")[2]
        if token != TOKEN:
            return CheckResponse(failures=[CheckFailure("", f"{token} is not provided here")])
        news = {k: v for k, v in request.new_inputs.items() if v.value is not None}
        failures = _unsupported(news, _INPUTS, "")
        connection = news.get("connection")
        if connection is None:
            failures.append(CheckFailure("connection", "connection is required"))
        elif isinstance(connection.value, Mapping):
            given = {k: v for k, v in connection.value.items() if v.value is not None}
            if "host" not in given:
                failures.append(CheckFailure("connection.host", "connection.host is required"))
            failures += _unsupported(given, _CONNECTION, "connection.")
            defaults = {k: wrap(v) for k, v in _CONNECTION_DEFAULTS.items()}
            news["connection"] = connection.with_value({**defaults, **given})
        news.setdefault("addPreviousOutputInEnv", wrap(True))
        return CheckResponse(inputs=news, failures=failures)

    async def diff(self, request: DiffRequest) -> DiffResponse:
        changes = changed_inputs(request.old_state, request.new_inputs, _OUTPUTS)
        return diff_response(changes, replaces={"triggers"})

    async def create(self, request: CreateRequest) -> CreateResponse:
        inputs = {k: plain(v) for k, v in request.properties.items()}
        stdout, stderr = unknown(), unknown()
        if not request.preview:
            command = inputs.get("create")
            out, err = (
                ("", "") if command is None else await _run("create", request.name, inputs, command)
            )
            stdout, stderr = wrap(out), wrap(err)
        return CreateResponse(
            resource_id=f"{request.name}{secrets.token_hex(4)}",
            properties=_state(request.properties, stdout, stderr),
        )

    async def update(self, request: UpdateRequest) -> UpdateResponse:
        inputs = {k: plain(v) for k, v in request.news.items()}
        command = inputs.get("update")
        if command is None:
            command = inputs.get("create")
        stdout = request.olds.get("stdout", wrap(""))
        stderr = request.olds.get("stderr", wrap(""))
        if request.preview:
            stdout, stderr = unknown(), unknown()
        elif command is not None:
            out, err = await _run("update", request.name, inputs, command)
            stdout, stderr = wrap(out), wrap(err)
        return UpdateResponse(properties=_state(request.news, stdout, stderr))

    async def delete(self, request: DeleteRequest) -> None:
        state = {k: plain(v) for k, v in request.properties.items()}
        if state.get("delete") is not None:
            await _run("delete", request.name, state, state["delete"])


if __name__ == "__main__":
    serve(CommandProvider(), "pulumi-command")
