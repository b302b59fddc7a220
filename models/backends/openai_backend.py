"""Client for OpenAI-compatible ``/v1/completions`` servers: ``vllm serve`` on GPU nodes, ``prmloop serve``.

Token ids and log-probabilities come from the legacy completions API with ``logprobs=1`` and vLLM's
``return_tokens_as_token_ids`` extension (tokens spelled ``"token_id:<id>"``), so records carry real
token ids; a server that ignores the extension is refused with an explanation rather than guessed at.

- :meth:`generate` sends one request per prompt (``n`` samples each), concurrently, so the server's
  continuous batching sees them together and ``usage.prompt_tokens`` is exact per prompt.
- :meth:`rollouts` is one request with ``n`` (vLLM shares the prefix's KV cache across them and,
  with ``--enable-prefix-caching``, across requests).
- :meth:`score` tokenises prompt and continuation separately with the server's ``/tokenize``
  (vLLM's extension), then sends the ids with ``echo=true`` and reads the continuation's prompt
  log-probabilities: the same tokenisation as the in-process :class:`Scorer`.

``base_url`` may name several servers of the same model, separated by commas (replicas: say one
one-thread vLLM engine per core). Each request then goes to the server with the fewest of this client's
requests in flight, the least used on a tie, so a client's concurrent requests spread over them.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prmloop.models.backends.base import Completion, FinishReason, SamplingParams, ScoredText
from prmloop.models.backends.request_log import RequestLog
from prmloop.models.backends.stopping import cut_at_answer

__all__ = ["OpenAICompatibleBackend", "OpenAIServerError", "TokenizedOpenAIBackend", "load_tokenizer"]

_TOKEN_ID_PREFIX = "token_id:"
_In = TypeVar("_In")
_Out = TypeVar("_Out")


class OpenAIServerError(RuntimeError):
    """The server refused a request or answered something this client cannot use."""


class OpenAICompatibleBackend:
    """``Generator`` and ``Scorer`` over HTTP.

    Attributes:
        model_name: the served model name sent as ``model`` (``vllm serve --served-model-name``).
        base_url: the server's API root, ending in ``/v1``; several servers separated by commas.
        max_concurrency: requests in flight at once for multi-prompt calls.
    """

    def __init__(
        self,
        model_name: str,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        default_params: SamplingParams | None = None,
        max_concurrency: int = 8,
        add_special_tokens: bool = False,
    ) -> None:
        import httpx

        self.model_name = model_name
        self.base_urls = tuple(u.strip().rstrip("/") for u in base_url.split(",") if u.strip())
        if not self.base_urls:
            raise ValueError(
                f"base_url {base_url!r} names no server: give http://HOST:PORT/v1 (several: comma-separated)"
            )
        self.base_url = ",".join(self.base_urls)
        self.default_params = default_params or SamplingParams()
        self.max_concurrency = max(1, max_concurrency)
        self.add_special_tokens = add_special_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clients = [httpx.Client(base_url=u, headers=headers, timeout=timeout_s) for u in self.base_urls]
        self._in_flight = [0] * len(self._clients)
        self._used = [0] * len(self._clients)
        self._pick_lock = threading.Lock()
        # $PRMLOOP_REQUEST_LOG: completion requests recorded for `prmloop bench replay` (default: none).
        self._request_log = RequestLog.from_environment()

    def close(self) -> None:
        for client in self._clients:
            client.close()
        if self._request_log is not None:
            self._request_log.close()

    def __enter__(self) -> OpenAICompatibleBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # HTTP
    # ---------------------------------------------------------------------------------------------

    def _pick(self) -> int:
        """The server with the fewest of this client's requests in flight (the least used on a tie)."""
        with self._pick_lock:
            index = min(range(len(self._clients)), key=lambda i: (self._in_flight[i], self._used[i], i))
            self._in_flight[index] += 1
            self._used[index] += 1
            return index

    def _post(self, path: str, body: dict[str, Any], *, at_root: bool = False) -> dict[str, Any]:
        """POST ``body`` to ``path`` under ``/v1`` (``at_root``: under the server's root, as vLLM's
        ``/tokenize``) of the least busy server."""
        import httpx

        index = self._pick()
        client, where = self._clients[index], self.base_urls[index]
        url = f"{where.removesuffix('/v1')}{path}" if at_root else path
        started, clock = time.time(), time.perf_counter()
        try:
            try:
                response = client.post(url, json=body)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # The server closed a kept-alive connection as the request went out (its idle timeout and
                # this reuse crossed; seen once in an hour's loop), with an end of stream or, where bytes
                # of the request were still unread, a reset: no answer came, so send it again once, on a
                # new connection. A request is stateless on the server, and seeded where it samples.
                response = client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise OpenAIServerError(
                f"cannot reach the completions server at {where} ({type(exc).__name__}: {exc}); "
                "is it running (`vllm serve ...` or `prmloop serve`) and is base_url right?"
            ) from exc
        finally:
            with self._pick_lock:
                self._in_flight[index] -= 1
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise OpenAIServerError(f"POST {url} at {where} answered HTTP {response.status_code}: {message}")
        payload: dict[str, Any] = response.json()
        if self._request_log is not None and path == "/completions" and not at_root:
            self._request_log.record(started, time.perf_counter() - clock, body, payload.get("usage"))
        return payload

    def _completion_request(self, prompt: str | list[int], params: SamplingParams, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt,
            "n": params.n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            # vLLM: do not prepend BOS to string prompts unless asked (chat templates carry it).
            "add_special_tokens": self.add_special_tokens,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(extra)
        return self._post("/completions", body)

    @staticmethod
    def _token_ids(tokens: Sequence[str], url: str) -> list[int]:
        ids = []
        for token in tokens:
            if not token.startswith(_TOKEN_ID_PREFIX):
                raise OpenAIServerError(
                    f"{url} returned token {token!r} instead of 'token_id:<id>': the server ignores "
                    "return_tokens_as_token_ids; use a vLLM server that supports it "
                    "or `prmloop serve`"
                )
            ids.append(int(token.removeprefix(_TOKEN_ID_PREFIX)))
        return ids

    def _completions(
        self, payload: dict[str, Any], expected: int, params: SamplingParams | None = None
    ) -> list[Completion]:
        choices = sorted(payload.get("choices", []), key=lambda c: c["index"])
        if len(choices) != expected:
            raise OpenAIServerError(f"expected {expected} choices from {self.base_url}, got {len(choices)}")
        prompt_tokens = int(payload.get("usage", {}).get("prompt_tokens", 0))
        out = []
        for choice in choices:
            block = choice.get("logprobs") or {}
            token_ids = self._token_ids(block.get("tokens", []), self.base_url)
            logprobs = [float(lp) for lp in block.get("token_logprobs", [])]
            finish = choice.get("finish_reason")
            if finish not in ("stop", "length"):
                raise OpenAIServerError(f"unexpected finish_reason {finish!r} from {self.base_url}")
            stop_reason = choice.get("stop_reason")
            text = choice["text"]
            if params is not None and params.stop_at_answer:
                text, token_ids, logprobs, cut = cut_at_answer(
                    text, token_ids, logprobs, functools.partial(self._tokens_before, list(token_ids))
                )
                if cut:
                    finish, stop_reason = "stop", "answer"
            out.append(
                Completion(
                    text=text,
                    token_ids=tuple(token_ids),
                    logprobs=tuple(logprobs),
                    finish_reason=_finish(finish),
                    prompt_tokens=prompt_tokens,
                    stop_reason=stop_reason if isinstance(stop_reason, str) else None,
                )
            )
        return out

    # ---------------------------------------------------------------------------------------------
    # Generator / Scorer
    # ---------------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        if isinstance(prompts, str):
            raise TypeError("generate() takes a sequence of prompts; wrap a single prompt in a list")
        params = params or self.default_params

        def one(prompt: str) -> list[Completion]:
            return self._completions(self._completion_request(prompt, params), params.n, params)

        if len(prompts) <= 1:
            return [one(prompt) for prompt in prompts]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(one, prompts))

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        params = (params or self.default_params).model_copy(update={"n": n})
        return self.generate([prefix], params)[0]

    def _tokens_before(self, token_ids: Sequence[int], end: int) -> int:
        """How many of ``token_ids`` start before character ``end`` of their decoded text.

        Servers spell tokens as ids, and their ``text_offset`` then counts the characters of the
        spellings, not of the text; so the decoded length of each prefix comes from ``/detokenize``,
        by bisection (the length grows with the prefix).
        """
        low, high = 0, len(token_ids)
        while low < high:
            middle = (low + high) // 2
            if len(self.detokenize(token_ids[:middle])) >= end:
                high = middle
            else:
                low = middle + 1
        return max(low, 0)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` from the server's ``/detokenize`` (vLLM extension; also served by prmloop serve)."""
        if not token_ids:
            return ""
        payload = self._post("/detokenize", {"model": self.model_name, "tokens": list(token_ids)}, at_root=True)
        return str(payload["prompt"])

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids from the server's ``/tokenize`` (vLLM extension; also served by prmloop serve)."""
        payload = self._post(
            "/tokenize",
            {"model": self.model_name, "prompt": text, "add_special_tokens": add_special_tokens},
            at_root=True,
        )
        return [int(t) for t in payload["tokens"]]

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        def encode(pair: tuple[str, str]) -> tuple[list[int], list[int]]:
            prompt, continuation = pair
            return self.tokenize(prompt, add_special_tokens=self.add_special_tokens), self.tokenize(continuation)

        return self.score_ids(self._map(encode, pairs))

    def score_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[ScoredText]:
        """Teacher-forced log-probabilities of each continuation's ids after its prompt's ids (``echo``).

        vLLM computes prompt log-probabilities without reading its prefix cache, so each of these
        requests prefills its whole prompt: callers keep them for text that has no sampled log-probs.
        """

        def one(pair: tuple[Sequence[int], Sequence[int]]) -> ScoredText:
            prompt_ids, cont_ids = list(pair[0]), list(pair[1])
            if not prompt_ids:
                raise ValueError("score() needs a non-empty prompt: the first token has no context to be scored in")
            payload = self._completion_request(
                prompt_ids + cont_ids, SamplingParams(max_new_tokens=1, temperature=0.0), echo=True
            )
            block = payload["choices"][0]["logprobs"]
            echoed = self._token_ids(block["tokens"], self.base_url)
            end = len(prompt_ids) + len(cont_ids)
            if echoed[:end] != prompt_ids + cont_ids:
                raise OpenAIServerError(f"{self.base_url} echoed different prompt tokens than it was sent")
            values = block["token_logprobs"][len(prompt_ids) : end]
            return ScoredText(
                token_ids=tuple(cont_ids), logprobs=tuple(float(v) for v in values), prompt_tokens=len(prompt_ids)
            )

        return self._map(one, pairs)

    def _map(self, function: Callable[[_In], _Out], items: Sequence[_In]) -> list[_Out]:
        """``function`` over ``items``, with up to ``max_concurrency`` requests in flight (order kept)."""
        if len(items) <= 1:
            return [function(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(function, items))


class TokenizedOpenAIBackend(OpenAICompatibleBackend):
    """The client with the served model's tokenizer on this side (``tokenizer``, e.g. the embedded SmolLM2's).

    With it prompts get the model's chat template (:func:`~prmloop.models.prompts.render_for`), the
    sampler records each step's token offset, so the scorer takes the sampled log-probabilities and
    never asks the engine for prompt log-probabilities (which bypass vLLM's prefix cache), the answer
    cut counts tokens locally, and scoring sends token ids without ``/tokenize`` round trips.
    """

    def __init__(self, model_name: str, *, tokenizer: Any, **options: Any) -> None:
        super().__init__(model_name, **options)
        self.tokenizer = tokenizer

    def encode_prompt(self, prompt: str) -> list[int]:
        """The prompt's ids as the server encodes a string prompt (``add_special_tokens`` as sent)."""
        return list(self.tokenizer.encode(prompt, add_special_tokens=self.add_special_tokens))

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        return self.score_ids(
            [(self.encode_prompt(p), self.tokenizer.encode(c, add_special_tokens=False)) for p, c in pairs]
        )

    def _tokens_before(self, token_ids: Sequence[int], end: int) -> int:
        from prmloop.models.steps import token_char_spans

        return sum(1 for start, _ in token_char_spans(self.tokenizer, token_ids) if start < end)


def load_tokenizer(name: str) -> Any:
    """A tokenizer for :class:`TokenizedOpenAIBackend`: ``"smollm2"`` (the embedded model's: from its
    converted folder when there is one, else from the GGUF; no conversion for a tokenizer alone), a
    folder or hub id."""
    from transformers import AutoTokenizer

    from prmloop.models.backends.embedded import EMBEDDED_MODEL_NAME, smollm2_gguf_path
    from prmloop.models.backends.hf_export import converted_smollm2_folder

    if name == EMBEDDED_MODEL_NAME:
        folder = converted_smollm2_folder()
        if folder is not None:
            return AutoTokenizer.from_pretrained(str(folder))
        path = smollm2_gguf_path()
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name)


def _finish(value: str) -> FinishReason:
    return "stop" if value == "stop" else "length"
