"""A loopback proxy in front of a Prefect server that asks for basic auth: what headless Chromium opens.

Prefect's UI asks a person for the server's auth string and keeps it in the browser; a screenshot
taken from the command line has no person. The proxy adds the ``Authorization`` header to every request
it forwards, and tells the UI (its ``/ui-settings``) that the API is the proxy's and needs no login.
It listens on a free loopback port for as long as the ``with`` block runs, and serves this user alone
(another user's connection is closed unanswered: :mod:`prmloop.flows.ops.peer`).
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prmloop.flows.ops.peer import is_own_user, loopback_peer_uid

__all__ = ["authenticating_proxy"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


@contextmanager
def authenticating_proxy(root: str, auth_string: str) -> Iterator[str]:
    """A proxy of the Prefect server at ``root`` (``http://host:port``) adding ``auth_string``; yields its root."""
    header = "Basic " + base64.b64encode(auth_string.encode()).decode()
    target = root.rstrip("/")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Authorization"] = header
            headers["Accept-Encoding"] = "identity"
            request = urllib.request.Request(target + self.path, data=body, headers=headers, method=self.command)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    status, out_headers, payload = response.status, response.headers, response.read()
            except urllib.error.HTTPError as error:
                status, out_headers, payload = error.code, error.headers, error.read()
            except OSError as error:
                self.send_error(502, f"the Prefect server does not answer: {error}")
                return
            if self.path.split("?", 1)[0].endswith("/ui-settings"):
                settings = json.loads(payload)
                settings["api_url"] = f"http://127.0.0.1:{self.server.server_address[1]}/api"  # type: ignore[index]
                settings["auth"] = None
                payload = json.dumps(settings).encode()
            self.send_response(status)
            for key, value in out_headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward

    class OwnUserOnly(ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            return is_own_user(loopback_peer_uid(request))

    server = OwnUserOnly(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="prefect-ui-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
