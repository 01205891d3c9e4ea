"""Fixtures for tests that run against real etcd / kube-apiserver / kube-scheduler.

Every test under tests/integration is marked ``integration``. The binaries are
built by ``tools/build-tools.sh`` (``make tools``); without them the tests are
skipped, except when ``CI=true``, where a missing tool fails the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tools.harness import (
    CONTROL_PLANE_TOOLS,
    TOOLS_BIN_ENV,
    LocalControlPlane,
    find_tool,
    free_port,
    missing_tools,
    tools_bin,
)
from tools.harness.stack import GANG_APISERVER_FLAGS

INTEGRATION_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


def require_tools(*names: str) -> None:
    """Skip the current test if a tool is not built; fail instead when CI=true."""
    missing = missing_tools(names or CONTROL_PLANE_TOOLS)
    if not missing:
        return
    message = (
        f"{', '.join(missing)} not found in {tools_bin()}: run `make tools` (tools/build-tools.sh)"
        f" or point ${TOOLS_BIN_ENV} at a directory holding them"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def built_tool(name: str) -> Path:
    """The path of a built tool; skip the test when it is missing, fail instead when CI=true."""
    require_tools(name)
    path = find_tool(name)
    assert path is not None
    return path


@pytest.fixture(name="require_tools")
def require_tools_fixture() -> Callable[..., None]:
    """``require_tools("kube-scheduler")`` inside a test: skip/fail like the fixtures do."""
    return require_tools


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM (CI cancellation, timeout(1)) like Ctrl-C while control planes run.

    pytest only unwinds fixtures on KeyboardInterrupt; on a plain SIGTERM the
    processes would still die (PR_SET_PDEATHSIG) but their temp dirs would stay.
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    """One etcd + kube-apiserver shared by the whole session, serving what the local cluster
    serves: its defaults and PodGroups (GANG_APISERVER_FLAGS, as ControlPlaneFeatures turns
    them on for scheduler.gangScheduling)."""
    require_tools(*CONTROL_PLANE_TOOLS)
    with _sigterm_as_interrupt(), LocalControlPlane(list(GANG_APISERVER_FLAGS)) as cp:
        yield cp


ControlPlaneFactory = Callable[..., LocalControlPlane]


@pytest.fixture
def control_plane_factory() -> Iterator[ControlPlaneFactory]:
    """Start extra control planes with their own flags; all stopped after the test.

    ``control_plane_factory(["--feature-gates=Foo=true"], startup_timeout=120)``
    takes the same arguments as :class:`LocalControlPlane` and returns it started.
    """
    require_tools(*CONTROL_PLANE_TOOLS)
    started: list[LocalControlPlane] = []

    def factory(extra_apiserver_flags: Sequence[str] = (), **kwargs: Any) -> LocalControlPlane:
        cp = LocalControlPlane(extra_apiserver_flags, **kwargs)
        started.append(cp)
        return cp.start()

    with _sigterm_as_interrupt():
        try:
            yield factory
        finally:
            for cp in reversed(started):
                cp.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: LocalControlPlane) -> Iterator[Any]:
    """``kubernetes.client.ApiClient`` (admin) for the session control plane."""
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()


# ------------------------------------------------------------------ a real sshd

SSHD = Path("/usr/sbin/sshd")


class Sshd:
    """sshd on 127.0.0.1 with its own host key, accepting one client key for root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.port = free_port()
        self.host_key = root / "ssh_host_ed25519_key"
        self.client_key = root / "client_key"
        for key in (self.host_key, self.client_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        (root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        config = root / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        self.log = (root / "sshd.log").open("w")
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=self.log, stderr=self.log
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["ssh-keyscan", "-p", str(self.port), "127.0.0.1"], capture_output=True, text=True
            )
            if "ssh-ed25519" in probe.stdout:
                return
            time.sleep(0.2)
        raise RuntimeError(f"sshd did not start: {(self.root / 'sshd.log').read_text()}")

    def public_host_key(self) -> str:
        return " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])

    def run(
        self, command: str, pinned: str, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """`command` as the remote shell's command, connecting only to the `pinned` key."""
        known_hosts = self.root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{self.port} {pinned}\n")
        exports = " ".join(f"export {k}={v};" for k, v in env.items())
        argv = [
            "ssh",
            "-p",
            str(self.port),
            "-i",
            str(self.client_key),
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "root@127.0.0.1",
            f"{exports} {command}",
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if os.geteuid() != 0:
        pytest.skip("sshd must run as root to log a user in")
    if not SSHD.exists() or not shutil.which("ssh"):
        reason = "openssh-server and openssh-client are needed (apt-get install openssh-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    server = Sshd(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()
