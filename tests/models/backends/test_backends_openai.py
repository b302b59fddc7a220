"""Specification of the OpenAI-compatible client against a real HTTP server (prmloop.flows.ops.serve).

The server runs the tiny random model in this process on a free port; requests go over TCP.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator

import httpx
import pytest

from prmloop.models.backends.base import Generator, SamplingParams, Scorer, TokenIdScorer, Tokenized
from prmloop.models.backends.openai_backend import (
    OpenAICompatibleBackend,
    OpenAIServerError,
    TokenizedOpenAIBackend,
)
from prmloop.models.backends.transformers_backend import TransformersBackend

PROMPTS = ["Question: what is 2 + 2?\nAnswer:", "Step 1: Let x be the number of apples. Step 2:"]
SERVED = "tiny-served"


@pytest.fixture()
def client(tiny_server_url: str) -> Iterator[OpenAICompatibleBackend]:
    with OpenAICompatibleBackend(SERVED, base_url=tiny_server_url, timeout_s=60) as backend:
        yield backend


def test_client_implements_the_generator_and_scorer_protocols(client: OpenAICompatibleBackend) -> None:
    assert isinstance(client, Generator)
    assert isinstance(client, Scorer)


def test_server_lists_its_model_and_answers_health(tiny_server_url: str) -> None:
    assert httpx.get(f"{tiny_server_url}/models").json()["data"][0]["id"] == SERVED
    assert httpx.get(tiny_server_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}


def test_generate_over_http_equals_the_in_process_backend(
    client: OpenAICompatibleBackend, tiny_backend: TransformersBackend
) -> None:
    params = SamplingParams(n=3, max_new_tokens=8, temperature=0.8, seed=7)
    remote = client.generate(PROMPTS, params)
    local = [tiny_backend.generate([prompt], params)[0] for prompt in PROMPTS]
    assert remote == local


def test_rollouts_over_http_are_one_request_with_n(
    client: OpenAICompatibleBackend, tiny_backend: TransformersBackend
) -> None:
    params = SamplingParams(max_new_tokens=6, seed=3)
    remote = client.rollouts(PROMPTS[1], 5, params)
    assert len(remote) == 5
    assert remote == tiny_backend.rollouts(PROMPTS[1], 5, params)


def test_stop_strings_travel_over_http(client: OpenAICompatibleBackend, tiny_backend: TransformersBackend) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    [full] = tiny_backend.rollouts(PROMPTS[0], 1, greedy)
    stop = tiny_backend.tokenizer.decode(full.token_ids[4:6])
    [remote] = client.rollouts(PROMPTS[0], 1, greedy.model_copy(update={"stop": (stop,)}))
    assert (remote.finish_reason, remote.stop_reason) == ("stop", stop)
    assert remote.text == full.text[: full.text.index(stop)]


def test_score_over_http_equals_the_in_process_scorer(
    client: OpenAICompatibleBackend, tiny_backend: TransformersBackend
) -> None:
    pairs = [(PROMPTS[0], " 4. The answer is 4."), (PROMPTS[1], " 3 apples")]
    for remote, local in zip(client.score(pairs), tiny_backend.score(pairs), strict=True):
        assert (remote.token_ids, remote.prompt_tokens) == (local.token_ids, local.prompt_tokens)
        assert max(abs(a - b) for a, b in zip(remote.logprobs, local.logprobs, strict=True)) < 1e-5


def test_an_unknown_model_name_is_reported_with_the_served_one(tiny_server_url: str) -> None:
    with (
        OpenAICompatibleBackend("gpt-5", base_url=tiny_server_url) as wrong,
        pytest.raises(OpenAIServerError, match=r"HTTP 400.*tiny-served"),
    ):
        wrong.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))


def test_invalid_sampling_parameters_are_a_400_not_a_crash(tiny_server_url: str) -> None:
    response = httpx.post(f"{tiny_server_url}/completions", json={"prompt": "x", "temperature": -1})
    assert response.status_code == 400
    assert "temperature" in response.json()["error"]["message"]


def test_an_unreachable_server_says_what_to_check() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        OpenAICompatibleBackend(SERVED, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5) as client,
        pytest.raises(OpenAIServerError, match="is it running"),
    ):
        client.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))


def _served_payload(ids: list[int], text: str) -> dict[str, object]:
    """A completion as vLLM's server (and prmloop serve) answer with ``return_tokens_as_token_ids``: the
    tokens are spelled ``token_id:<id>`` and ``text_offset`` counts the characters of those spellings,
    not of the text."""
    spelled = [f"token_id:{i}" for i in ids]
    offsets = [sum(len(s) for s in spelled[:k]) for k in range(len(spelled))]
    block = {"tokens": spelled, "token_logprobs": [-1.0] * len(ids), "text_offset": offsets}
    return {
        "choices": [{"index": 0, "text": text, "logprobs": block, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3},
    }


@pytest.mark.parametrize("local_tokenizer", [False, True], ids=["server-detokenizes", "local-tokenizer"])
def test_the_answer_cut_keeps_the_tokens_of_the_answer_whatever_the_servers_offsets(
    tiny_server_url: str, tiny_backend: TransformersBackend, local_tokenizer: bool
) -> None:
    tokenizer = tiny_backend.tokenizer
    answer = "Step 2: 5 + 7 = 12. The answer is 12."
    text = answer + " Then more words follow"
    ids = tokenizer.encode(text, add_special_tokens=False)
    client = (
        TokenizedOpenAIBackend(SERVED, tokenizer=tokenizer, base_url=tiny_server_url)
        if local_tokenizer
        else OpenAICompatibleBackend(SERVED, base_url=tiny_server_url)
    )
    with client:
        [cut] = client._completions(_served_payload(ids, text), 1, SamplingParams(stop_at_answer=True))
    assert (cut.text, cut.stop_reason) == (answer, "answer")
    assert tokenizer.decode(list(cut.token_ids)) == answer
    assert len(cut.logprobs) == len(cut.token_ids)


def test_the_tokenized_client_scores_and_encodes_like_the_in_process_backend(
    tiny_server_url: str, tiny_backend: TransformersBackend
) -> None:
    pairs = [(PROMPTS[0], " 4. The answer is 4."), (PROMPTS[1], " 3 apples")]
    with TokenizedOpenAIBackend(SERVED, tokenizer=tiny_backend.tokenizer, base_url=tiny_server_url) as client:
        assert isinstance(client, TokenIdScorer)
        assert client.encode_prompt(PROMPTS[0]) == tiny_backend.encode_prompt(PROMPTS[0])
        for remote, local in zip(client.score(pairs), tiny_backend.score(pairs), strict=True):
            assert (remote.token_ids, remote.prompt_tokens) == (local.token_ids, local.prompt_tokens)
            assert max(abs(a - b) for a, b in zip(remote.logprobs, local.logprobs, strict=True)) < 1e-5


def test_the_plain_client_has_no_tokenizer_so_steps_come_from_text(client: OpenAICompatibleBackend) -> None:
    assert not isinstance(client, Tokenized)


def _read_request(conn: socket.socket) -> None:
    """Read one whole HTTP request (head and ``Content-Length`` body): a socket closed with bytes still
    unread sends a reset, not an end of stream, so a partial read would make the close a different fault."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


def _dropping_server(drops: int, *, reset: bool = False) -> tuple[int, list[int], threading.Thread]:
    """A server that reads each request and closes the connection without an answer ``drops`` times
    (with a reset where ``reset``), then answers every request with one completion; returns its port, the
    requests it read, and its thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen: list[int] = []
    body = json.dumps(_served_payload([42], " 7")).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def serve() -> None:
        with listener:
            listener.settimeout(10)
            while len(seen) < drops + 1:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    return
                with conn:
                    _read_request(conn)
                    seen.append(len(seen))
                    if len(seen) > drops:
                        conn.sendall(reply)
                    elif reset:  # linger 0: close sends RST, as a peer that died or timed out may
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], seen, thread


def test_a_connection_the_server_drops_unanswered_is_sent_again_once() -> None:
    port, seen, thread = _dropping_server(drops=1)
    with OpenAICompatibleBackend(SERVED, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5) as client:
        answer = client._post("/completions", {"model": SERVED, "prompt": "x"})
    thread.join(5)
    assert len(seen) == 2 and answer["choices"][0]["text"] == " 7"


def test_a_connection_the_server_resets_unanswered_is_sent_again_once() -> None:
    port, seen, thread = _dropping_server(drops=1, reset=True)
    with OpenAICompatibleBackend(SERVED, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5) as client:
        answer = client._post("/completions", {"model": SERVED, "prompt": "x"})
    thread.join(5)
    assert len(seen) == 2 and answer["choices"][0]["text"] == " 7"


def test_a_server_that_drops_twice_is_reported_not_retried_forever() -> None:
    port, seen, _thread = _dropping_server(drops=2)
    with (
        OpenAICompatibleBackend(SERVED, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5) as client,
        pytest.raises(OpenAIServerError, match="RemoteProtocolError"),
    ):
        client._post("/completions", {"model": SERVED, "prompt": "x"})
    assert len(seen) == 2  # the first try and one more, no third


def _counting_server(backend: TransformersBackend) -> tuple[object, str, list[int]]:
    """A second real server on the tiny model that counts the completions it answers."""
    from prmloop.flows.ops.serve import CompletionServer, make_http_server

    calls = [0]
    lock = threading.Lock()

    class Counting(CompletionServer):
        def completions(self, body: dict[str, object]) -> dict[str, object]:
            with lock:
                calls[0] += 1
            return super().completions(body)

    httpd = make_http_server(Counting(backend, SERVED))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    host, port = httpd.server_address[:2]
    return httpd, f"http://{host!s}:{port}/v1", calls


def test_several_servers_share_a_clients_requests_and_answer_as_one(tiny_backend: TransformersBackend) -> None:
    servers = [_counting_server(tiny_backend) for _ in range(2)]
    urls = ",".join(url for _, url, _ in servers)
    try:
        with OpenAICompatibleBackend(SERVED, base_url=f" {urls}, ", timeout_s=60, max_concurrency=4) as client:
            assert client.base_urls == tuple(url for _, url, _ in servers)
            params = SamplingParams(max_new_tokens=6, seed=3)
            # one at a time: none in flight, so the least used: they take turns
            for _ in range(4):
                assert client.rollouts(PROMPTS[1], 2, params) == tiny_backend.rollouts(PROMPTS[1], 2, params)
            assert [calls[0] for _, _, calls in servers] == [2, 2]
            # eight prompts, four in flight at once: both servers answer, every answer as in process
            prompts = [f"Question: what is {i} + {i}?\nAnswer:" for i in range(8)]
            remote = client.generate(prompts, SamplingParams(max_new_tokens=4, seed=1))
            assert remote == [tiny_backend.generate([p], SamplingParams(max_new_tokens=4, seed=1))[0] for p in prompts]
            counts = [calls[0] - 2 for _, _, calls in servers]
            assert sum(counts) == 8 and min(counts) >= 2
            # the root's /tokenize works on whichever server is picked
            assert (
                client.tokenize("2 + 2")
                == client.tokenize("2 + 2")
                == tiny_backend.tokenizer.encode("2 + 2", add_special_tokens=False)
            )
    finally:
        for httpd, _, _ in servers:
            httpd.shutdown()  # type: ignore[attr-defined]
            httpd.server_close()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="names no server"):
        OpenAICompatibleBackend(SERVED, base_url=" , ")


def test_a_dead_server_among_several_is_named_in_the_error(tiny_server_url: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with OpenAICompatibleBackend(SERVED, base_url=f"{tiny_server_url},{dead}", timeout_s=5) as client:
        client.rollouts(PROMPTS[0], 1, SamplingParams(max_new_tokens=2))  # the first server: least used
        with pytest.raises(OpenAIServerError, match=f"at {dead}"):
            client.rollouts(PROMPTS[0], 1, SamplingParams(max_new_tokens=2))
