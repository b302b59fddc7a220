"""A small OpenAI-compatible completions server backed by the in-process transformers backend.

It lets CPU machines (and tests) talk to prmloop's models over the same HTTP API as ``vllm serve`` on
GPU nodes, so the :mod:`~prmloop.models.backends.openai_backend` client is exercised against a real
server. It implements the subset of the API that client uses:

- ``GET /v1/models`` and ``GET /health``;
- ``POST /tokenize`` (vLLM's extension): ``{"prompt": str, "add_special_tokens": bool}`` ->
  ``{"tokens": [ids], "count": n}``; ``POST /detokenize``: ``{"tokens": [ids]}`` -> ``{"prompt": str}``;
- ``POST /v1/completions`` with ``prompt`` (a string, a list of strings, a list of token ids or a list
  of such lists), ``max_tokens`` (0 allowed with ``echo``), ``temperature``, ``top_p``, ``n``,
  ``stop``, ``seed``, ``logprobs`` (the sampled token's log-probability; ``top_logprobs`` is always
  ``null``), ``echo`` (prompt tokens with their teacher-forced log-probabilities, the first ``null``)
  and vLLM's ``return_tokens_as_token_ids`` (tokens spelled ``"token_id:<id>"``).

Requests are served one at a time per model (the backend holds a lock); the HTTP server is the
standard library's threading server, so health checks answer while a generation runs.

Run it with ``python -m prmloop.flows.ops.serve --model smollm2 --port 8000``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prmloop.models.backends.base import SamplingParams
from prmloop.models.backends.transformers_backend import TransformersBackend

__all__ = ["CompletionServer", "main", "make_http_server", "serve", "serve_in_thread"]

logger = logging.getLogger(__name__)


class _BadRequest(ValueError):
    """The request is malformed; answered with HTTP 400 and an OpenAI-style error body."""


def _as_prompts(raw: Any) -> list[str | list[int]]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        return [list(raw)]
    if isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        return list(raw)
    if isinstance(raw, list) and raw and all(isinstance(x, list) and all(isinstance(i, int) for i in x) for x in raw):
        return [list(x) for x in raw]
    raise _BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists")


def _stop_strings(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return tuple(raw)
    raise _BadRequest("'stop' must be a string or a list of strings")


class CompletionServer:
    """The request logic, independent of the HTTP plumbing (one backend, one served model name)."""

    def __init__(self, backend: TransformersBackend, served_model_name: str | None = None) -> None:
        self.backend = backend
        self.served_model_name = served_model_name or backend.model_name

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.served_model_name, "object": "model", "owned_by": "prmloop", "created": 0}],
        }

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.served_model_name:
            raise _BadRequest(f"model {model!r} is not served here; this server serves {self.served_model_name!r}")

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _BadRequest("'prompt' must be a string")
        add_special = bool(body.get("add_special_tokens", self.backend.add_special_tokens))
        tokens = self.backend.tokenizer.encode(prompt, add_special_tokens=add_special)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": None}

    def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise _BadRequest("'tokens' must be a list of token ids")
        return {"prompt": str(self.backend.tokenizer.decode(tokens, skip_special_tokens=True))}

    def _token_ids(self, prompt: str | list[int]) -> list[int]:
        return prompt if isinstance(prompt, list) else self.backend.encode_prompt(prompt)

    def _pieces(self, ids: Sequence[int], as_ids: bool) -> list[str]:
        """Token strings: ``token_id:<id>`` or each token's decoded text (by incremental decoding)."""
        if as_ids:
            return [f"token_id:{i}" for i in ids]
        pieces, previous = [], ""
        for k in range(1, len(ids) + 1):
            text = str(self.backend.tokenizer.decode(list(ids[:k])))
            pieces.append(text[len(previous) :])
            previous = text
        return pieces

    def _logprobs_block(
        self, ids: Sequence[int], logprobs: Sequence[float | None], as_ids: bool, start_offset: int
    ) -> dict[str, Any]:
        pieces = self._pieces(ids, as_ids)
        offsets, offset = [], start_offset
        for piece in pieces:
            offsets.append(offset)
            offset += len(piece)
        return {
            "tokens": pieces,
            "token_logprobs": list(logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_model(body)
        if body.get("stream"):
            raise _BadRequest("streaming is not supported by this server; send stream=false")
        prompts = _as_prompts(body.get("prompt"))
        try:
            n = int(body.get("n", 1))
            max_tokens = int(body.get("max_tokens", 16))
            temperature = float(body.get("temperature", 1.0))
            top_p = float(body.get("top_p", 1.0))
            seed = body.get("seed")
            logprobs = body.get("logprobs")
        except (TypeError, ValueError) as exc:
            raise _BadRequest(f"invalid sampling parameter: {exc}") from exc
        echo = bool(body.get("echo", False))
        as_ids = bool(body.get("return_tokens_as_token_ids", False))
        if max_tokens < 0 or (max_tokens == 0 and not echo):
            raise _BadRequest("'max_tokens' must be at least 1 (0 is allowed only with echo=true)")
        prompt_ids = [self._token_ids(p) for p in prompts]
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        generated: list[list[Any]] = [[] for _ in prompts]
        if max_tokens > 0:
            try:
                params = SamplingParams(
                    n=n,
                    max_new_tokens=max_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    stop=_stop_strings(body.get("stop")),
                    seed=None if seed is None else int(seed),
                )
            except ValueError as exc:
                raise _BadRequest(str(exc)) from exc
            generated = [list(c) for c in self.backend.generate_ids(prompt_ids, params)]
        echoed: list[tuple[list[int], list[float | None]]] = []
        if echo:
            for ids in prompt_ids:
                if not ids:
                    raise _BadRequest("echo needs a non-empty prompt")
                [scored] = self.backend.score_ids([(ids[:1], ids[1:])])
                echoed.append((ids, [None, *scored.logprobs]))
        for p, ids in enumerate(prompt_ids):
            prompt = prompts[p]
            prompt_text = prompt if isinstance(prompt, str) else str(self.backend.tokenizer.decode(ids))
            prompt_tokens += len(ids)
            for j in range(n if max_tokens > 0 else 1):
                completion = generated[p][j] if max_tokens > 0 else None
                text = completion.text if completion is not None else ""
                token_ids: list[int] = list(completion.token_ids) if completion is not None else []
                token_lps: list[float | None] = list(completion.logprobs) if completion is not None else []
                completion_tokens += len(token_ids)
                if echo:
                    text = prompt_text + text
                    token_ids = echoed[p][0] + token_ids
                    token_lps = echoed[p][1] + token_lps
                block = None
                if logprobs is not None:
                    block = self._logprobs_block(token_ids, token_lps, as_ids, 0)
                choices.append(
                    {
                        "index": len(choices),
                        "text": text,
                        "logprobs": block,
                        "finish_reason": completion.finish_reason if completion is not None else "length",
                        "stop_reason": completion.stop_reason if completion is not None else None,
                    }
                )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _handler_for(server: CompletionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s - %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str, kind: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": int(status)}})

        def do_GET(self) -> None:
            if self.path in ("/health", "/v1/health"):
                self._send(HTTPStatus.OK, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(HTTPStatus.OK, server.models())
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}", "not_found_error")

        def do_POST(self) -> None:
            routes = {
                "/v1/completions": server.completions,
                "/tokenize": server.tokenize,
                "/detokenize": server.detokenize,
            }
            route = routes.get(self.path)
            if route is None:
                self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}", "not_found_error")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise _BadRequest("the request body must be a JSON object")
                self._send(HTTPStatus.OK, route(body))
            except (_BadRequest, json.JSONDecodeError) as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc), "invalid_request_error")
            except Exception as exc:
                logger.exception("request to %s failed", self.path)
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}", "server_error")

    return Handler


def make_http_server(server: CompletionServer, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Bind (``port=0`` picks a free port; read it from ``server_address``) without serving yet."""
    httpd = ThreadingHTTPServer((host, port), _handler_for(server))
    httpd.daemon_threads = True
    return httpd


def serve_in_thread(
    backend: TransformersBackend, host: str = "127.0.0.1", port: int = 0, served_model_name: str | None = None
) -> tuple[ThreadingHTTPServer, str]:
    """Start serving in a daemon thread; returns the server (call ``shutdown()``) and its ``/v1`` URL."""
    httpd = make_http_server(CompletionServer(backend, served_model_name), host, port)
    thread = threading.Thread(target=httpd.serve_forever, name="prmloop-serve", daemon=True)
    thread.start()
    bound_host, bound_port = httpd.server_address[:2]
    return httpd, f"http://{bound_host!s}:{bound_port}/v1"


def serve(
    model: str = "smollm2",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    gguf_file: str | None = None,
    served_model_name: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    max_batch_size: int = 64,
    num_threads: int | None = None,
) -> None:
    """Load ``model`` and serve it until interrupted (what ``prmloop serve`` calls)."""
    backend = TransformersBackend.from_pretrained(
        model,
        device=device,
        dtype=dtype,
        gguf_file=gguf_file,
        max_batch_size=max_batch_size,
        num_threads=num_threads,
    )
    httpd = make_http_server(CompletionServer(backend, served_model_name), host, port)
    bound_host, bound_port = httpd.server_address[:2]
    logger.info("serving %s at http://%s:%s/v1", served_model_name or backend.model_name, bound_host, bound_port)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m prmloop.flows.ops.serve``: command-line front end of :func:`serve`."""
    parser = argparse.ArgumentParser(description="OpenAI-compatible /v1/completions server (transformers backend)")
    parser.add_argument("--model", default="smollm2", help="'smollm2' (embedded GGUF), a local folder or hub id")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --model's folder")
    parser.add_argument("--served-model-name", default=None, help="name clients pass as 'model'")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    serve(
        args.model,
        host=args.host,
        port=args.port,
        gguf_file=args.gguf_file,
        served_model_name=args.served_model_name,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        num_threads=args.num_threads,
    )


if __name__ == "__main__":
    main()
