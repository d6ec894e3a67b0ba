"""One streaming chat client for every check that talks to a server: the smoke and the soak.

Both ask an OpenAI-compatible `/v1/chat/completions` at temperature 0 and read its
server-sent events; they differ only in what they do with each token (the smoke keeps the text
and times the first token; the soak counts tokens into time buckets and may stop reading
mid-stream). So the request body, the status and content-type checks, the event reader and
the rule for "this chunk carried generated text" live here once, and a change to any of them
(a server that names reasoning differently, say) reaches both checks.

A server that answers JSON to `stream: true` (no SSE) is read as one non-streamed answer
unless the caller needs a stream (the soak: a non-streaming server cannot stall visibly).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests

#: Connect and read timeouts of one request (seconds), unless the caller gives others.
REQUEST_TIMEOUT_S = (10.0, 300.0)


class ChatError(ValueError):
    """The server answered, but not with a chat completion (status, body or stream)."""


@dataclass
class Completion:
    """One chat request: what came back and how fast."""

    phase: str
    prompt: str
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tokens: int = 0
    #: "usage" when the server reported completion_tokens, "deltas" (content chunks) when it
    #: streamed without usage, "words" for a non-streamed answer without usage.
    token_source: str = "deltas"
    ttft_s: float | None = None
    total_s: float = 0.0
    streamed: bool = True
    error: str | None = None
    #: True when the caller stopped reading before the stream ended (`on_text` said so).
    stopped: bool = False

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens/s after the first token; without streaming, over the whole request."""
        if self.error or self.tokens == 0 or self.total_s <= 0:
            return None
        if self.streamed and self.ttft_s is not None and self.tokens > 1:
            decode = self.total_s - self.ttft_s
            return (self.tokens - 1) / decode if decode > 0 else None
        return self.tokens / self.total_s


#: Called for every chunk that carried generated text; returning False stops reading.
OnText = Callable[[], bool]


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The request every check sends: greedy, streamed, usage asked for at the end."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_chat(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    phase: str = "",
    session: requests.Session | None = None,
    timeout: tuple[float, float] = REQUEST_TIMEOUT_S,
    require_stream: bool = False,
    on_text: OnText | None = None,
    headers: dict[str, str] | None = None,
) -> Completion:
    """POST one chat request to url and read the answer; failures land in `error`, never raise.

    url is the full `/v1/chat/completions` address. on_text runs on every chunk carrying text
    (the soak's token clock); returning False ends the read and marks the completion stopped.
    """
    completion = Completion(phase=phase, prompt=prompt)
    began = time.monotonic()
    post = session.post if session is not None else requests.post
    try:
        with post(
            url,
            json=chat_body(model, prompt, max_tokens),
            stream=True,
            timeout=timeout,
            headers=headers,
        ) as response:
            read_response(
                response, completion, began, require_stream=require_stream, on_text=on_text
            )
    except (requests.RequestException, ValueError) as exc:
        completion.error = f"{exc.__class__.__name__}: {exc}"[:500]
    completion.total_s = time.monotonic() - began
    return completion


def read_response(
    response: requests.Response,
    completion: Completion,
    began: float,
    *,
    require_stream: bool = False,
    on_text: OnText | None = None,
) -> None:
    """SSE when the server streams; a JSON body (non-streaming fallback) otherwise."""
    if response.status_code != 200:
        raise ChatError(f"HTTP {response.status_code}: {response.text[:300]}")
    if "text/event-stream" not in response.headers.get("content-type", ""):
        if require_stream:
            raise ChatError("the server did not stream (no text/event-stream answer)")
        completion.streamed = False
        _apply_json(completion, response.json())
        return
    deltas = 0
    for event in sse_events(response):
        if _apply_chunk(completion, event, began):
            deltas += 1
            if on_text is not None and not on_text():
                completion.stopped = True
                break
    if completion.token_source != "usage":
        completion.tokens = deltas


def sse_events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an OpenAI-compatible stream; an error event mid-stream ends it as a
    ChatError with the server's words."""
    for raw in response.iter_lines(decode_unicode=False):
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if isinstance(event, dict):
            if "error" in event:
                raise ChatError(f"server error in stream: {str(event['error'])[:300]}")
            yield event


def carries_text(event: dict[str, Any]) -> bool:
    """Whether a chunk carried generated text (a token, near enough): content or reasoning."""
    return any(_delta_text(choice) != ("", "") for choice in event.get("choices") or [])


def _delta_text(choice: dict[str, Any]) -> tuple[str, str]:
    delta = choice.get("delta") or {}
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return content, reasoning


def _apply_chunk(completion: Completion, event: dict[str, Any], began: float) -> bool:
    """Fold one chunk in; True when it carried generated text."""
    _apply_usage(completion, event)
    carried = False
    for choice in event.get("choices") or []:
        content, reasoning = _delta_text(choice)
        if content or reasoning:
            carried = True
            if completion.ttft_s is None:
                completion.ttft_s = time.monotonic() - began
        completion.text += content
        completion.reasoning += reasoning
        completion.finish_reason = choice.get("finish_reason") or completion.finish_reason
    return carried


def _apply_json(completion: Completion, body: dict[str, Any]) -> None:
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    completion.text = message.get("content") or ""
    completion.reasoning = message.get("reasoning_content") or ""
    completion.finish_reason = choice.get("finish_reason")
    _apply_usage(completion, body)
    if completion.token_source != "usage":
        completion.tokens = len(completion.text.split())
        completion.token_source = "words"


def _apply_usage(completion: Completion, body: dict[str, Any]) -> None:
    usage = body.get("usage") or {}
    if isinstance(usage.get("completion_tokens"), int):
        completion.tokens = usage["completion_tokens"]
        completion.token_source = "usage"


__all__ = [
    "REQUEST_TIMEOUT_S",
    "ChatError",
    "Completion",
    "OnText",
    "carries_text",
    "chat_body",
    "read_response",
    "sse_events",
    "stream_chat",
]
