"""``python -m tools.harness up``: run a local control plane until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from .child_process import ControlPlaneError
from .controlplane import LocalControlPlane
from .tools import tools_bin


def _up(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    print(f"starting etcd + kube-apiserver from {tools_bin()} ...", flush=True)
    try:
        with LocalControlPlane(args.apiserver_flag, startup_timeout=args.timeout) as cp:
            scheduler = None
            if args.scheduler:
                scheduler = cp.start_scheduler()
            print(f"kubeconfig: {cp.kubeconfig_path}")
            print(f"server:     {cp.server}")
            print(f"pids:       {cp.pids}")
            if scheduler is not None:
                print(f"scheduler log: {scheduler.log_path}")
            print(f"\n  export KUBECONFIG={cp.kubeconfig_path}\n")
            print("Ctrl-C to stop", flush=True)
            try:
                while not stop.wait(1.0):
                    pass
            except KeyboardInterrupt:
                pass
            print("stopping ...", flush=True)
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.harness")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start etcd + kube-apiserver and wait for Ctrl-C")
    up.add_argument(
        "--apiserver-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra kube-apiserver flag, e.g. --apiserver-flag=--feature-gates=Foo=true",
    )
    up.add_argument("--scheduler", action="store_true", help="also start kube-scheduler")
    up.add_argument("--timeout", type=float, default=90.0, help="startup timeout in seconds")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
