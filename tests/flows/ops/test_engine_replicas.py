"""Engine replicas without vLLM: the setting, the servers' health and metrics summed over real HTTP
servers, and the supervisor that runs the servers side by side (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prmloop.flows.ops.engine import EngineError, engine_replicas, engine_urls, read_metrics, wait_ready
from prmloop.flows.ops.replicas import parse_ports, supervise


def _metrics(running: int, tokens: float) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        f'vllm:num_requests_running{{engine="0",model_name="smollm2"}} {running}.0\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="smollm2"}} {tokens}\n'
    )


@pytest.fixture()
def servers() -> Iterator[list[tuple[str, dict[str, object]]]]:
    """Two real HTTP servers answering /health (when ``healthy``) and /metrics (their ``text``)."""
    out: list[tuple[str, dict[str, object]]] = []
    started: list[ThreadingHTTPServer] = []
    for running, tokens in ((3, 100.0), (2, 50.5)):
        state: dict[str, object] = {"healthy": True, "text": _metrics(running, tokens)}

        class Handler(BaseHTTPRequestHandler):
            own = state

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health" and self.own["healthy"]:
                    body = b"{}"
                elif self.path == "/metrics":
                    body = str(self.own["text"]).encode()
                else:
                    self.send_error(503)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        out.append((f"http://127.0.0.1:{httpd.server_address[1]}/v1", state))
    yield out
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def test_replicas_are_one_unless_asked_and_a_bad_value_says_what_to_give() -> None:
    assert engine_replicas({}) == 1
    assert engine_replicas({"PRMLOOP_ENGINE_REPLICAS": " 2 "}) == 2
    for bad in ("0", "two", "-1", "17"):
        with pytest.raises(EngineError, match=r"PRMLOOP_ENGINE_REPLICAS.*1 to 16"):
            engine_replicas({"PRMLOOP_ENGINE_REPLICAS": bad})
    assert engine_urls("http://a:1/v1, http://b:2/v1/,") == ["http://a:1/v1", "http://b:2/v1"]
    assert parse_ports("40001,40002") == [40001, 40002]
    for bad in ("", "40001,40001", "x,1", "0", "70000"):
        with pytest.raises(ValueError, match="--ports"):
            parse_ports(bad)


def test_the_engine_is_ready_when_every_server_is_and_its_metrics_are_their_sum(
    servers: list[tuple[str, dict[str, object]]],
) -> None:
    url = ",".join(u for u, _ in servers)
    metrics = read_metrics(url)
    assert metrics["requests_running"] == 5.0 and metrics["generation_tokens"] == 150.5
    assert wait_ready(url, 5, lambda: True)
    servers[1][1]["healthy"] = False
    assert not wait_ready(url, 2.5, lambda: True)  # one of two is not ready: the engine is not
    assert not wait_ready(url, 30, lambda: False)  # its process died: no waiting out the timeout
    with pytest.raises(OSError):
        read_metrics(url + ",http://127.0.0.1:1/v1")  # a server that does not answer is no partial sum


def _sleeper(seconds: float = 60.0) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def test_when_one_server_ends_the_supervisor_stops_the_others_and_exits_with_its_code() -> None:
    started = time.monotonic()
    code = supervise([_sleeper(), [sys.executable, "-c", "raise SystemExit(3)"]], poll_s=0.1)
    assert code == 3 and time.monotonic() - started < 15  # the sleeper was stopped, not waited out


def test_a_supervisor_told_to_stop_stops_its_servers_and_exits_cleanly() -> None:
    script = (
        "import sys\n"
        "from prmloop.flows.ops.replicas import supervise\n"
        f"sys.exit(supervise([{_sleeper()!r}, {_sleeper()!r}], poll_s=0.1))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    try:
        time.sleep(3.0)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
