"""etcd for a local control plane: one member on 127.0.0.1, its data in the plane's work dir."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from .child_process import ManagedProcess, free_port, http_ok, wait_until


class Etcd:
    """A single-member etcd on free ports; :meth:`stop` removes its data dir as well."""

    def __init__(self, binary: Path, workdir: Path, extra_flags: Sequence[str] = ()) -> None:
        self.binary = binary
        self.data_dir = workdir / "etcd-data"
        self.log_path = workdir / "etcd.log"
        self.extra_flags = list(extra_flags)
        self.client_port = 0
        self.peer_port = 0
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(self.binary),
            "--name=local",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--initial-cluster-state=new",
            # Throw-away data: skip fsync, it dominates latency on slow disks.
            "--unsafe-no-fsync=true",
            *self.extra_flags,
        ]

    def start(self, timeout: float) -> None:
        """Start on fresh ports; returns once ``/health`` answers 200."""
        self.client_port = free_port()
        self.peer_port = free_port()
        self._launch()
        wait_until("etcd", lambda: http_ok(f"{self.url}/health", None), [self.process], timeout)

    def _launch(self) -> None:
        self.process = ManagedProcess("etcd", self.argv(), self.log_path)
        self.process.start()

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop etcd and start it again on the same ports and data (no wait: the caller waits
        for whatever depends on it)."""
        assert self.process is not None, "etcd not started"
        self.process.stop()
        time.sleep(down_seconds)
        self._launch()

    def stop(self) -> None:
        """Stop the process and remove the data dir; safe to call more than once."""
        if self.process is not None:
            self.process.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
