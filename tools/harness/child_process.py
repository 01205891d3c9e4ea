"""One child process of the harness: its own process group, its output in a log file.

Every process runs in its own process group and is killed together with its group on stop, and
(on Linux, when started from the main thread) when the Python process dies, so a failed or
interrupted run leaves no processes behind. :func:`wait_until` is the one readiness loop: it
fails as soon as a watched process exits, and its error carries every watched log's tail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """A harness process failed to start or died."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (or why it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the child gets SIGKILL when this process dies (Linux, setpriv).

    util-linux's setpriv sets PR_SET_PDEATHSIG and execs the command (same pid). It replaces a
    preexec_fn: that forces fork() and runs Python in the child, where the pthread_atfork
    handlers of the gRPC threads the Pulumi engine leaves in this process abort it now and then
    (SIGABRT, "epoll_wait error: Bad file descriptor") before the command starts; without one,
    subprocess uses vfork and no handler runs. PR_SET_PDEATHSIG fires when the *thread* that
    started the child exits, so it is only asked for from the main thread. Without setpriv the
    command runs as it is (the stale-workdir sweep still reaps what a killed run leaves).
    """
    setpriv = shutil.which("setpriv")
    if (
        setpriv is None
        or not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


class Lifecycle:
    """`with x:` for objects with start() (returning self) and stop()."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ManagedProcess:
    """A child process in its own process group with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self._log = self.log_path.open("ab")
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        self._popen = subprocess.Popen(
            _die_with_parent(self.argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own session + process group (pgid == pid)
        )

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        popen, self._popen = self._popen, None
        if popen is not None:
            pgid = popen.pid
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=grace)
            # Whatever is left of the group (the leader, or anything it forked).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def no_proxy_opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """A urllib opener that ignores $https_proxy (everything here is on 127.0.0.1)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def unverified_context() -> ssl.SSLContext:
    """A TLS context for a component's own self-signed health endpoint."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return insecure


def http_ok(url: str, context: ssl.SSLContext | None) -> bool:
    """``GET url`` answered 200."""
    try:
        with no_proxy_opener(context).open(url, timeout=5) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return False


def log_report(processes: Sequence[ManagedProcess | None]) -> str:
    """The tail of each process's log, headed by its name and path."""
    parts = []
    for proc in processes:
        if proc is not None:
            parts.append(
                f"--- last {LOG_TAIL_LINES} lines of {proc.name} log ({proc.log_path}) ---\n"
                f"{proc.tail()}"
            )
    return "\n".join(parts)


def wait_until(
    what: str,
    ready: Callable[[], bool],
    processes: Sequence[ManagedProcess | None],
    timeout: float,
) -> None:
    """Poll ``ready`` until it holds; :class:`ControlPlaneError` when one of ``processes``
    exits or ``timeout`` seconds pass, with the tail of every process's log."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in processes:
            if proc is not None and not proc.running():
                raise ControlPlaneError(
                    f"{proc.name} exited with code {proc.returncode} while waiting for"
                    f" {what}\n{log_report(processes)}"
                )
        if ready():
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"{what} not ready after {timeout:.0f} s\n{log_report(processes)}"
            )
        time.sleep(0.2)
