"""A TLS reverse proxy in front of the local kube-apiserver that fails some node writes.

It stands in for an unreliable path to the API server (an overloaded API server, a load
balancer timing out): a share of the PATCH and PUT requests on `/api/v1/nodes/...` are
answered 500 (as an API server answers when etcd fails a write) or, after a delay, 504 (a
gateway that gave up), without reaching the API server; everything else is passed through
as the admin. Clients reach it with `kubeconfig()`, which trusts the proxy's own certificate.

Streaming (watches) is not passed through: it serves clients that list and patch, like the
stack's node layers.
"""

from __future__ import annotations

import http.client
import http.server
import random
import re
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tools.harness.certs import CertificateAuthority
from tools.harness.child_process import free_port
from tools.harness.controlplane import LocalControlPlane

NODE_WRITE = re.compile(r"^/api/v1/nodes/[^/?]+(/status)?(\?.*)?$")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class FaultyApiProxy:
    """Proxy on 127.0.0.1 failing `rate` of node writes (half 500, half 504 after `delay`)."""

    def __init__(
        self, control_plane: LocalControlPlane, rate: float, *, seed: int = 0, delay: float = 1.0
    ) -> None:
        self.control_plane = control_plane
        self.rate = rate
        self.delay = delay
        self.random = random.Random(seed)
        self.failed: list[tuple[str, str, int]] = []
        """(method, path, status) of every write it failed."""
        self.passed = 0
        self.port = free_port()
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="faulty-proxy-"))
        self._ca = CertificateAuthority("faulty-proxy-ca")
        pair = self._ca.issue("faulty-proxy", ip_addresses=["127.0.0.1"], server=True)
        (self._dir / "tls.crt").write_bytes(pair.cert_pem)
        (self._dir / "tls.key").write_bytes(pair.key_pem)
        self._server: http.server.ThreadingHTTPServer | None = None

    def kubeconfig(self) -> str:
        """An admin kubeconfig that reaches the API server through the proxy."""
        import base64

        ca = base64.b64encode(self._ca.cert_pem).decode()
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "faulty",
                        "cluster": {
                            "server": f"https://127.0.0.1:{self.port}",
                            "certificate-authority-data": ca,
                        },
                    }
                ],
                "users": [{"name": "admin", "user": {"token": "proxied"}}],
                "contexts": [{"name": "faulty", "context": {"cluster": "faulty", "user": "admin"}}],
                "current-context": "faulty",
            }
        )

    def _fails(self, method: str, path: str) -> int | None:
        if method not in ("PATCH", "PUT") or not NODE_WRITE.match(path):
            return None
        with self._lock:
            if self.random.random() >= self.rate:
                return None
            status = self.random.choice((500, 504))
            self.failed.append((method, path, status))
            return status

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        upstream = http.client.HTTPSConnection(
            "127.0.0.1", self.control_plane.secure_port, context=self.control_plane.ssl_context()
        )
        try:
            upstream.request(method, path, body=body or None, headers=headers)
            response = upstream.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            upstream.close()

    def start(self) -> FaultyApiProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status = proxy._fails(self.command, self.path)
                if status is not None:
                    if status == 504:
                        time.sleep(proxy.delay)
                    text = f'{{"kind":"Status","status":"Failure","code":{status}}}'.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in HOP_BY_HOP and k.lower() != "authorization"
                }
                code, reply_headers, reply = proxy._forward(self.command, self.path, headers, body)
                with proxy._lock:
                    proxy.passed += 1
                self.send_response(code)
                for key, value in reply_headers:
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self._dir / "tls.crt"), str(self._dir / "tls.key"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
