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
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prmloop.models.backends.base import Completion, FinishReason, SamplingParams, ScoredText

__all__ = ["OpenAICompatibleBackend", "OpenAIServerError"]

_TOKEN_ID_PREFIX = "token_id:"


class OpenAIServerError(RuntimeError):
    """The server refused a request or answered something this client cannot use."""


class OpenAICompatibleBackend:
    """``Generator`` and ``Scorer`` over HTTP.

    Attributes:
        model_name: the served model name sent as ``model`` (``vllm serve --served-model-name``).
        base_url: the server's API root, ending in ``/v1``.
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
        self.base_url = base_url.rstrip("/")
        self.default_params = default_params or SamplingParams()
        self.max_concurrency = max(1, max_concurrency)
        self.add_special_tokens = add_special_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        # /tokenize is served at the root by vLLM (not under /v1).
        self._root = self.base_url.removesuffix("/v1")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatibleBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # HTTP
    # ---------------------------------------------------------------------------------------------

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            response = self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise OpenAIServerError(
                f"cannot reach the completions server at {self.base_url} ({type(exc).__name__}: {exc}); "
                "is it running (`vllm serve ...` or `python -m prmloop.models.serve`) and is base_url right?"
            ) from exc
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise OpenAIServerError(f"POST {url} answered HTTP {response.status_code}: {message}")
        payload: dict[str, Any] = response.json()
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
                    "return_tokens_as_token_ids; use a vLLM server that supports it or `python -m prmloop.models.serve`"
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
                text, token_ids, logprobs, cut = _cut_at_answer(text, token_ids, logprobs, block.get("text_offset"))
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

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids from the server's ``/tokenize`` (vLLM extension; also served by prmloop serve)."""
        payload = self._post(
            f"{self._root}/tokenize",
            {"model": self.model_name, "prompt": text, "add_special_tokens": add_special_tokens},
        )
        return [int(t) for t in payload["tokens"]]

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        def one(pair: tuple[str, str]) -> ScoredText:
            prompt, continuation = pair
            prompt_ids = self.tokenize(prompt, add_special_tokens=self.add_special_tokens)
            cont_ids = self.tokenize(continuation)
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

        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(pairs)))) as pool:
            return list(pool.map(one, pairs))


def _finish(value: str) -> FinishReason:
    return "stop" if value == "stop" else "length"


def _cut_at_answer(
    text: str, token_ids: list[int], logprobs: list[float], offsets: Any
) -> tuple[str, list[int], list[float], bool]:
    """A server generates past the answer; keep the text up to it and the tokens that start before its
    end (by the response's ``text_offset``), so perplexities weigh the same tokens as a local engine's."""
    from prmloop.models.answers import answer_end

    end = answer_end(text)
    if end is None or not isinstance(offsets, list) or len(offsets) != len(token_ids) or not offsets:
        return text, token_ids, logprobs, False
    base = int(offsets[0])
    keep = sum(1 for o in offsets if int(o) - base < end)
    return text[:end], token_ids[:keep], logprobs[:keep], True
