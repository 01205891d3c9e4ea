"""The local control-plane harness starts real, correctly configured components."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tools.harness import ControlPlaneError, LocalControlPlane, ToolVersionError, require_tool
from tools.harness.processes import process_table
from tools.harness.tools import PINNED_BY, TOOLS_BIN_ENV, pinned_version, reported_version

K8S_VERSION = pinned_version("kube-apiserver")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _dongle_pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/pause:1",
                    resources=client.V1ResourceRequirements(limits={"example.com/dongle": "1"}),
                )
            ],
        ),
    )


def _has_dongle_toleration(pod: Any) -> bool:
    return any(
        t.key == "example.com/dongle" and t.operator == "Exists" and t.effect == "NoSchedule"
        for t in pod.spec.tolerations or []
    )


def test_apiserver_reports_pinned_version(
    control_plane: LocalControlPlane, api_client: Any
) -> None:
    assert control_plane.get("/version")["gitVersion"] == K8S_VERSION
    info = client.VersionApi(api_client).get_code()
    assert K8S_VERSION is not None
    major, minor = K8S_VERSION.removeprefix("v").split(".")[:2]
    assert (info.git_version, info.major, info.minor) == (K8S_VERSION, major, minor)


def test_kubeconfig_gives_admin_access(control_plane: LocalControlPlane, api_client: Any) -> None:
    assert control_plane.kubeconfig_path.is_file()
    assert control_plane.server.startswith("https://127.0.0.1:")
    core = client.CoreV1Api(api_client)

    ns = _name("harness")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    namespace: Any = core.read_namespace(ns)
    assert namespace.status.phase == "Active"

    node_name = _name("node")
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=node_name, labels={"example.com/pool": "test"}),
            spec=client.V1NodeSpec(
                taints=[client.V1Taint(key="example.com/dongle", effect="NoSchedule")]
            ),
        )
    )
    try:
        node: Any = core.read_node(node_name)
        assert node.metadata.labels["example.com/pool"] == "test"
        # TaintNodesByCondition adds node.kubernetes.io/not-ready on create.
        assert "example.com/dongle" in [t.key for t in node.spec.taints]
    finally:
        core.delete_node(node_name)
        core.delete_namespace(ns)


def test_extra_apiserver_flags_are_applied(
    control_plane: LocalControlPlane, control_plane_factory: Callable[..., LocalControlPlane]
) -> None:
    with_plugin = control_plane_factory(["--enable-admission-plugins=ExtendedResourceToleration"])
    assert with_plugin.server != control_plane.server

    results = {}
    for label, cp in (("default", control_plane), ("with_plugin", with_plugin)):
        ns = _name("dongle")
        # No kube-controller-manager: create the "default" ServiceAccount that
        # the ServiceAccount admission plugin insists on.
        cp.create_namespace(ns)
        api = cp.api_client()
        try:
            created = client.CoreV1Api(api).create_namespaced_pod(ns, _dongle_pod("p"))
        finally:
            api.close()
        results[label] = _has_dongle_toleration(created)

    assert results == {"default": False, "with_plugin": True}


def test_scheduler_binds_pod(
    control_plane: LocalControlPlane, api_client: Any, require_tools: Callable[..., None]
) -> None:
    require_tools("kube-scheduler")
    core = client.CoreV1Api(api_client)
    ns = _name("sched")
    control_plane.create_namespace(ns)
    node_name = _name("node")
    control_plane.create_node(node_name, labels={"example.com/pool": "sched"})
    config = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: harness-scheduler
"""
    try:
        with control_plane.start_scheduler(config) as scheduler:
            assert scheduler.running()
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name="p"),
                spec=client.V1PodSpec(
                    scheduler_name="harness-scheduler",
                    automount_service_account_token=False,
                    containers=[client.V1Container(name="main", image="registry.invalid/x:1")],
                ),
            )
            core.create_namespaced_pod(ns, pod)
            deadline = time.monotonic() + 30
            while True:
                scheduled: Any = core.read_namespaced_pod("p", ns)
                if scheduled.spec.node_name == node_name:
                    break
                assert time.monotonic() < deadline, scheduler.tail()
                time.sleep(0.2)
            assert "harness-scheduler" in scheduler.config_path.read_text()
            assert scheduler.log()
        assert not scheduler.running()
    finally:
        core.delete_node(node_name)


def test_stop_leaves_no_processes_or_files(require_tools: Callable[..., None]) -> None:
    require_tools()
    cp = LocalControlPlane()
    with pytest.raises(RuntimeError, match="boom"), cp:
        pids = cp.pids
        workdir = cp.workdir
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(_pid_alive(pid) for pid in pids.values())
        raise RuntimeError("boom")
    assert not any(_pid_alive(pid) for pid in pids.values())
    assert not workdir.exists()
    assert cp.pids == {}
    cp.stop()  # idempotent


def test_startup_failure_reports_logs_and_cleans_up(require_tools: Callable[..., None]) -> None:
    require_tools()
    cp = LocalControlPlane(["--no-such-flag=1"], startup_timeout=30)
    with pytest.raises(ControlPlaneError) as excinfo:
        cp.start()
    message = str(excinfo.value)
    assert "kube-apiserver exited" in message
    assert "unknown flag: --no-such-flag" in message
    assert "lines of etcd log" in message
    assert cp.pids == {}
    with pytest.raises(ControlPlaneError):
        _ = cp.workdir


def _processes_under(directory: Path) -> list[str]:
    """Command lines of the processes that name a path under ``directory``."""
    return [
        " ".join(p.argv)
        for p in process_table().values()
        if any(str(directory) in a for a in p.argv)
    ]


def test_apiserver_failing_to_start_stops_etcd_and_removes_its_data(
    require_tools: Callable[..., None], tmp_path: Path
) -> None:
    require_tools()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cp = LocalControlPlane([f"--secure-port={port}"], startup_timeout=60, base_dir=tmp_path)
        with pytest.raises(ControlPlaneError) as excinfo:
            cp.start()
    message = str(excinfo.value)
    assert "kube-apiserver exited" in message
    assert "address already in use" in message
    assert "lines of kube-apiserver log" in message
    assert "lines of etcd log" in message
    assert _processes_under(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    assert cp.pids == {}


def test_built_binaries_report_the_pinned_versions(require_tools: Callable[..., None]) -> None:
    require_tools(*PINNED_BY)
    for name in PINNED_BY:
        assert reported_version(require_tool(name)) == pinned_version(name), name


def _stand_in(directory: Path, name: str, version_output: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{version_output}'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("name", "version_output", "reported"),
    [
        ("kube-apiserver", "Kubernetes v1.36.4", "v1.36.4"),
        ("kube-scheduler", "Kubernetes v1.38.0", "v1.38.0"),
        ("etcd", "etcd Version: 3.5.21", "v3.5.21"),
        ("kubeadm", "v1.35.0", "v1.35.0"),
    ],
)
def test_prebuilt_binary_of_another_release_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    version_output: str,
    reported: str,
) -> None:
    _stand_in(tmp_path, name, version_output)
    monkeypatch.setenv(TOOLS_BIN_ENV, str(tmp_path))
    with pytest.raises(ToolVersionError) as excinfo:
        require_tool(name)
    message = str(excinfo.value)
    assert f"{name} at {tmp_path / name} is {reported}" in message
    assert f"pins {pinned_version(name)}" in message


def test_prebuilt_binary_without_a_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(tmp_path, "kube-apiserver", "usage: kube-apiserver [flags]")
    monkeypatch.setenv(TOOLS_BIN_ENV, str(tmp_path))
    with pytest.raises(ToolVersionError, match=r"reports no version.*usage: kube-apiserver"):
        require_tool("kube-apiserver")


def test_control_plane_refuses_a_prebuilt_apiserver_of_another_release(
    require_tools: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_tools()
    prebuilt = tmp_path / "bin"
    prebuilt.mkdir()
    etcd = require_tool("etcd")
    (prebuilt / "etcd").symlink_to(etcd)
    _stand_in(prebuilt, "kube-apiserver", "Kubernetes v1.36.4")
    monkeypatch.setenv(TOOLS_BIN_ENV, str(prebuilt))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ToolVersionError, match=r"kube-apiserver .* is v1\.36\.4"):
        LocalControlPlane(base_dir=work).start()
    assert list(work.iterdir()) == []


def test_control_plane_runs_prebuilt_binaries_of_the_pinned_release(
    require_tools: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_tools()
    prebuilt = tmp_path / "bin"
    prebuilt.mkdir()
    for name in ("etcd", "kube-apiserver"):
        (prebuilt / name).symlink_to(require_tool(name))
    monkeypatch.setenv(TOOLS_BIN_ENV, str(prebuilt))
    with LocalControlPlane() as cp:
        assert cp.get("/version")["gitVersion"] == K8S_VERSION
        running = _processes_under(prebuilt)
        assert any(f"{prebuilt / 'etcd'} " in command for command in running)
        assert any(f"{prebuilt / 'kube-apiserver'} " in command for command in running)


def test_harness_child_process_dies_with_the_process_that_started_it(tmp_path: Any) -> None:
    """A harness process outlives no killed test run (setpriv's PR_SET_PDEATHSIG)."""
    import shutil
    import signal
    import subprocess
    import sys

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) not found: children are reaped by the workdir sweep")
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tools.harness.child_process import ManagedProcess\n"
        "p = ManagedProcess('sleep', ['sleep', '120'], Path(sys.argv[1]))\n"
        "p.start()\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "sleep.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    # Popen returns once setpriv runs; it sets the signal, then becomes the command.
    started = time.monotonic() + 10
    while not _cmdline(child).startswith("sleep") and time.monotonic() < started:
        time.sleep(0.05)
    assert _running(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait a while for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
