"""The one chat client (builder/verify/chat.py) the smoke and the soak share, against a real
HTTP server on loopback (tests/support/fake_chat.py) that streams, answers JSON, fails or
breaks off as asked."""

from __future__ import annotations

import socket

from builder.verify.chat import carries_text, chat_body, stream_chat
from tests.support.fake_chat import Behaviour, fake_chat_server, url_of


def _chat_url(server: object) -> str:
    return url_of(server) + "/v1/chat/completions"  # type: ignore[arg-type]


def test_body_is_greedy_streamed_and_asks_for_usage() -> None:
    with fake_chat_server(Behaviour(tokens=3)) as server:
        stream_chat(_chat_url(server), "tiny", "Hello?", 7)
    (body,) = server.bodies
    assert body == chat_body("tiny", "Hello?", 7)
    assert body["temperature"] == 0 and body["stream"] is True and body["max_tokens"] == 7
    assert body["stream_options"] == {"include_usage": True}


def test_stream_counts_text_chunks_and_times_the_first() -> None:
    with fake_chat_server(Behaviour(tokens=5)) as server:
        completion = stream_chat(_chat_url(server), "tiny", "Hello?", 16, phase="warm")
    assert completion.error is None
    assert completion.text == "t0 t1 t2 t3 t4 "
    assert (completion.tokens, completion.token_source) == (5, "deltas")
    assert completion.streamed and completion.phase == "warm"
    assert completion.ttft_s is not None and 0 < completion.ttft_s <= completion.total_s
    assert completion.decode_tok_s is not None and completion.decode_tok_s > 0


def test_usage_chunk_wins_over_counted_deltas() -> None:
    with fake_chat_server(Behaviour(tokens=4, usage_tokens=11)) as server:
        completion = stream_chat(_chat_url(server), "tiny", "Hello?", 16)
    assert (completion.tokens, completion.token_source) == (11, "usage")


def test_reasoning_deltas_count_as_generated_text() -> None:
    with fake_chat_server(Behaviour(tokens=3, reasoning=True)) as server:
        completion = stream_chat(_chat_url(server), "tiny", "Hello?", 16)
    assert completion.text == "" and completion.reasoning == "t0 t1 t2 "
    assert completion.tokens == 3 and completion.ttft_s is not None
    assert carries_text({"choices": [{"delta": {"reasoning": "x"}}]})
    assert not carries_text({"choices": [{"delta": {"role": "assistant"}}], "usage": {}})


def test_json_answer_is_read_unless_a_stream_is_required() -> None:
    with fake_chat_server(Behaviour(json_only=True)) as server:
        plain = stream_chat(_chat_url(server), "tiny", "Hello?", 16)
        required = stream_chat(_chat_url(server), "tiny", "Hello?", 16, require_stream=True)
    assert plain.error is None and not plain.streamed
    assert (plain.text, plain.tokens, plain.token_source) == ("t0 t1 t2", 3, "words")
    assert required.error is not None and "did not stream" in required.error


def test_http_error_and_error_event_and_refused_connection_are_errors_not_raises() -> None:
    with fake_chat_server(Behaviour(fail_every=1)) as server:
        failed = stream_chat(_chat_url(server), "tiny", "Hello?", 16)
    assert failed.error is not None and "HTTP 500" in failed.error
    with fake_chat_server(Behaviour(tokens=5, error_after=2)) as server:
        broken = stream_chat(_chat_url(server), "tiny", "Hello?", 16)
    assert broken.error is not None and "injected mid-stream" in broken.error
    assert broken.text == "t0 t1 "
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = stream_chat(f"http://127.0.0.1:{port}/v1/chat/completions", "tiny", "Hi", 4)
    assert refused.error is not None and "ConnectionError" in refused.error


def test_on_text_sees_every_token_and_can_stop_the_read() -> None:
    seen: list[int] = []

    def stop_after_two() -> bool:
        seen.append(1)
        return len(seen) < 2

    with fake_chat_server(Behaviour(tokens=6)) as server:
        completion = stream_chat(_chat_url(server), "tiny", "Hello?", 16, on_text=stop_after_two)
    assert len(seen) == 2 and completion.stopped
    assert completion.text == "t0 t1 " and completion.error is None


def test_headers_reach_the_server() -> None:
    with fake_chat_server(Behaviour(tokens=1)) as server:
        stream_chat(_chat_url(server), "tiny", "Hi", 4, headers={"Authorization": "Bearer k"})
    assert server.headers[0]["authorization"] == "Bearer k"
