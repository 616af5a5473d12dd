"""A small client for OpenAI-compatible chat-completion endpoints, over httpx.

This module owns one thing: sending a list of chat messages to
``{base_url}/chat/completions`` and turning the reply, whole or streamed, into
a typed :class:`ChatResult`. It does not own prompts (:mod:`host_kernel.prompts`)
nor any agent loop. The API key is read from the environment variable that
:attr:`LLMConfig.api_key_env` names, at call time; it is sent as a Bearer
token and never logged, stored on an object or put into an error message.

Retry policy: a reply with status 429 or 5xx, and a failure to connect, are
retried up to :attr:`LLMConfig.max_retries` times. The wait before retry *n*
(counting from 0) is the server's ``Retry-After`` when it gives one, else
``backoff * 2**n``; either is capped at :attr:`LLMConfig.max_backoff`. Any
other 4xx fails at once. A stream that breaks after it began is not retried,
because part of it has already been read.

The exception tree::

    LLMError                  anything this module raises on purpose
    ├── LLMConfigError        bad configuration, or the key's variable is unset
    ├── LLMConnectionError    the server could not be reached or the transfer broke
    ├── LLMStatusError        the server answered with an error status
    └── LLMResponseError      a 2xx reply that is not a chat completion
"""

from __future__ import annotations

import email.utils
import enum
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Protocol, Self

import httpx

__all__ = [
    "ChatClient",
    "ChatResult",
    "LLMClient",
    "LLMConfig",
    "LLMConfigError",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMStatusError",
    "ToolCall",
    "Usage",
    "retry_delay",
]

logger = logging.getLogger(__name__)

_EXCERPT_CHARS: Final[int] = 300
_RETRYABLE_TRANSPORT_ERRORS: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# --------------------------------------------------------------------------- errors


class LLMError(Exception):
    """Base class of every error this module raises on purpose."""

    code: str = "llm_error"


class LLMConfigError(LLMError):
    """The configuration cannot work: a bad value, or the API key variable is unset."""

    code = "llm_config"


class LLMConnectionError(LLMError):
    """The server could not be reached, timed out, or the transfer broke off."""

    code = "llm_connection"

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class LLMStatusError(LLMError):
    """The server answered with an error status (after any retries it allowed)."""

    code = "llm_status"

    def __init__(self, status: int, body_excerpt: str, *, attempts: int) -> None:
        super().__init__(
            f"chat completion failed with HTTP {status} ({_attempts(attempts)}): {body_excerpt}"
        )
        self.status = status
        self.body_excerpt = body_excerpt
        self.attempts = attempts

    @property
    def retryable(self) -> bool:
        """True for the statuses the client retries (429 and 5xx)."""
        return _retryable_status(self.status)


class LLMResponseError(LLMError):
    """A successful status whose body is not a chat completion this module can read."""

    code = "llm_response"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class LLMConfig:
    """Where to send chat completions and how patiently.

    ``base_url`` ends before ``/chat/completions`` (e.g. ``http://127.0.0.1:8000/v1``).
    ``api_key_env`` names the environment variable holding the key; ``api_key_file``
    a file holding it instead (read at each call, so the key is never in the Host's
    start-time environment, which ``/proc/<pid>/environ`` shows); neither sends no
    Authorization header (a local server). ``timeout`` is per request
    in seconds; ``max_retries`` counts retries, not attempts; ``backoff`` is the
    first wait in seconds; ``max_backoff`` caps every wait, ``Retry-After`` too.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 30.0
    api_key_file: str | None = None

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise LLMConfigError(
                f"base_url must start with http:// or https://, got {self.base_url!r}"
            )
        if not self.model:
            raise LLMConfigError("model must be a non-empty string")
        if self.api_key_env == "":
            raise LLMConfigError("api_key_env must name a variable, or be None for no key")
        if self.api_key_env is not None and self.api_key_file is not None:
            raise LLMConfigError("give api_key_env or api_key_file, not both")
        if not self.timeout > 0:
            raise LLMConfigError(f"timeout must be positive, got {self.timeout!r}")
        if self.max_retries < 0:
            raise LLMConfigError(f"max_retries must be 0 or more, got {self.max_retries!r}")
        if not (self.backoff >= 0 and self.max_backoff >= 0):
            raise LLMConfigError("backoff and max_backoff must be 0 or more")

    @property
    def endpoint(self) -> str:
        """The full chat-completions URL."""
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts the server reported for one call."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for.

    ``arguments`` is the parsed JSON object; when ``raw_arguments`` is not a
    JSON object it is ``{}`` and ``arguments_error`` says why, so a caller can
    tell the model rather than guess. An empty raw string means no arguments.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str
    arguments_error: str | None = None


@dataclass(frozen=True, slots=True)
class ChatResult:
    """What one chat completion returned (the first choice only).

    ``usage`` is ``None`` when the server did not report it: unknown is not
    zero. ``model`` is the model the server named, ``None`` if it named none.
    ``raw`` is the decoded JSON body, or for a stream the list of its chunks.
    """

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str | None
    raw: dict[str, Any] | list[dict[str, Any]] = field(repr=False, compare=False)


class ChatClient(Protocol):
    """What :mod:`host_kernel.prompts` and an agent loop need from a client."""

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        stream: bool = False,
        temperature: float | None = None,
    ) -> ChatResult: ...


# --------------------------------------------------------------------------- helpers


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def _is_json(response: httpx.Response) -> bool:
    # A server that ignores stream=True answers with one JSON body; read it whole.
    content_type: str = response.headers.get("Content-Type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


def _retryable_status(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def retry_delay(config: LLMConfig, retry_index: int, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number ``retry_index`` (0 for the first retry)."""
    told = _parse_retry_after(retry_after)
    wait = told if told is not None else config.backoff * (2**retry_index)
    return min(wait, config.max_backoff)


def _excerpt(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    text = " ".join(text.split())
    if len(text) > _EXCERPT_CHARS:
        text = text[:_EXCERPT_CHARS] + "…"
    return text or "(empty body)"


def _parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _parse_usage(value: object) -> Usage | None:
    if not isinstance(value, Mapping):
        return None
    prompt = value.get("prompt_tokens")
    completion = value.get("completion_tokens")
    total = value.get("total_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    if not isinstance(total, int):
        total = prompt + completion
    return Usage(prompt, completion, total)


def _first_choice(body: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise LLMResponseError("reply has no choices")
    choice: Mapping[str, Any] = choices[0]
    return choice


def _result_from_body(body: dict[str, Any]) -> ChatResult:
    choice = _first_choice(body)
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise LLMResponseError("reply's first choice has no message")
    calls: list[ToolCall] = []
    for item in message.get("tool_calls") or ():
        function = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(function, Mapping):
            raise LLMResponseError("reply has a tool call without a function")
        raw = function.get("arguments")
        raw_text = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
        arguments, error = _parse_arguments(raw_text)
        calls.append(
            ToolCall(
                id=str(item.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=arguments,
                raw_arguments=raw_text,
                arguments_error=error,
            )
        )
    content = message.get("content")
    model = body.get("model")
    return ChatResult(
        content=content if isinstance(content, str) else "",
        tool_calls=tuple(calls),
        finish_reason=_str_or_none(choice.get("finish_reason")),
        usage=_parse_usage(body.get("usage")),
        model=model if isinstance(model, str) else None,
        raw=body,
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """Yield the data of each server-sent event (multi-line data joined by newlines)."""
    pending: list[str] = []
    for line in lines:
        if line == "":
            if pending:
                yield "\n".join(pending)
                pending = []
        elif line.startswith("data:"):
            value = line[5:]
            pending.append(value.removeprefix(" "))
        # "event:", "id:", "retry:" and ":" comment lines carry nothing we use.
    if pending:
        yield "\n".join(pending)


class _StreamAssembly:
    """Folds streamed chunks into the pieces of one ChatResult."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.done = False

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks.append(chunk)
        if isinstance(chunk.get("error"), Mapping):
            detail = json.dumps(chunk["error"])[:_EXCERPT_CHARS]
            raise LLMResponseError(f"stream reported an error: {detail}")
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        usage = _parse_usage(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                self._add_choice(choice)

    def _add_choice(self, choice: Mapping[str, Any]) -> None:
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            return
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        for piece in delta.get("tool_calls") or ():
            if not isinstance(piece, Mapping):
                continue
            index = piece.get("index")
            if not isinstance(index, int):
                index = len(self.calls)
            slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            if isinstance(piece.get("id"), str):
                slot["id"] = piece["id"]
            function = piece.get("function")
            if isinstance(function, Mapping):
                # Names normally arrive whole in one delta, arguments in many;
                # concatenating both handles either.
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        slot[key] += function[key]

    def result(self) -> ChatResult:
        if not self.done and self.finish_reason is None:
            raise LLMResponseError("stream ended before [DONE] and without a finish reason")
        calls = []
        for index in sorted(self.calls):
            slot = self.calls[index]
            arguments, error = _parse_arguments(slot["arguments"])
            calls.append(ToolCall(slot["id"], slot["name"], arguments, slot["arguments"], error))
        return ChatResult(
            content="".join(self.content),
            tool_calls=tuple(calls),
            finish_reason=self.finish_reason,
            usage=self.usage,
            model=self.model,
            raw=self.chunks,
        )


# --------------------------------------------------------------------------- client


class _State(enum.Enum):
    OPEN = "open"  # the httpx client exists and accepts requests
    CLOSED = "closed"  # close() ran; every later chat() raises LLMError


class LLMClient:
    """A synchronous chat-completions client; use it as a context manager.

    ``transport`` replaces httpx's network transport (an ``httpx.MockTransport``
    for instance); by default requests go over the network, honouring the
    usual proxy variables.
    """

    def __init__(self, config: LLMConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        self.config = config
        self._http = httpx.Client(timeout=config.timeout, transport=transport)
        self._state = _State.OPEN

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool; safe to call twice."""
        if self._state is _State.OPEN:
            self._state = _State.CLOSED
            self._http.close()

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        stream: bool = False,
        temperature: float | None = None,
    ) -> ChatResult:
        """Send one chat completion and return its first choice.

        Raises :class:`LLMStatusError` on an error status (after retries for
        429 and 5xx), :class:`LLMConnectionError` when the server cannot be
        reached, :class:`LLMResponseError` when a 2xx body is not understood,
        and :class:`LLMConfigError` when the key's variable is unset.
        """
        if self._state is _State.CLOSED:
            raise LLMError("the LLM client is closed")
        key = self._api_key()
        payload: dict[str, Any] = {"model": self.config.model, "messages": list(messages)}
        if tools:
            payload["tools"] = list(tools)
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if temperature is not None:
            payload["temperature"] = temperature
        if stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        request = self._http.build_request(
            "POST", self.config.endpoint, json=payload, headers=headers
        )
        return self._send(request, stream=stream, key=key)

    def _api_key(self) -> str | None:
        if self.config.api_key_file is not None:
            try:
                with open(self.config.api_key_file, encoding="utf-8") as f:
                    key = f.read().strip()
            except OSError as exc:
                raise LLMConfigError(f"cannot read the API key file {self.config.api_key_file}:"
                                     f" {exc.strerror}") from None
            if not key:
                raise LLMConfigError(f"the API key file {self.config.api_key_file} is empty")
            return key
        name = self.config.api_key_env
        if name is None:
            return None
        value = os.environ.get(name)
        if not value:
            raise LLMConfigError(f"environment variable {name} holding the API key is not set")
        return value

    def _send(self, request: httpx.Request, *, stream: bool, key: str | None) -> ChatResult:
        attempts = 0
        while True:
            attempts += 1
            retries_left = attempts <= self.config.max_retries
            try:
                response = self._http.send(request, stream=True)
            except _RETRYABLE_TRANSPORT_ERRORS as exc:
                if not retries_left:
                    raise LLMConnectionError(
                        f"could not connect to {self.config.endpoint} "
                        f"({_attempts(attempts)}): {type(exc).__name__}: {exc}",
                        attempts=attempts,
                    ) from None
                self._wait(attempts - 1, None, f"connection failed ({type(exc).__name__})")
                continue
            except httpx.HTTPError as exc:
                raise LLMConnectionError(
                    f"request to {self.config.endpoint} failed: {type(exc).__name__}: {exc}",
                    attempts=attempts,
                ) from None
            try:
                status = response.status_code
                if not 200 <= status < 300:  # redirects are not followed: an error too
                    body = self._read_text(response, attempts)
                    if _retryable_status(status) and retries_left:
                        retry_after = response.headers.get("Retry-After")
                    else:
                        raise LLMStatusError(status, _excerpt(body, key), attempts=attempts)
                elif stream and not _is_json(response):
                    return self._read_stream(response, attempts)
                else:
                    return self._read_json(response, attempts, key)
            finally:
                response.close()
            self._wait(attempts - 1, retry_after, f"HTTP {status}")

    def _wait(self, retry_index: int, retry_after: str | None, why: str) -> None:
        delay = retry_delay(self.config, retry_index, retry_after)
        logger.info(
            "chat completion %s; retry %d of %d in %.3g s",
            why,
            retry_index + 1,
            self.config.max_retries,
            delay,
        )
        time.sleep(delay)

    def _read_text(self, response: httpx.Response, attempts: int) -> str:
        try:
            response.read()
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                f"reading the reply broke off: {type(exc).__name__}", attempts=attempts
            ) from None
        return response.text

    def _read_json(self, response: httpx.Response, attempts: int, key: str | None) -> ChatResult:
        text = self._read_text(response, attempts)
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            raise LLMResponseError(f"reply is not JSON: {_excerpt(text, key)}") from None
        if not isinstance(body, dict):
            raise LLMResponseError("reply is not a JSON object")
        return _result_from_body(body)

    def _read_stream(self, response: httpx.Response, attempts: int) -> ChatResult:
        assembly = _StreamAssembly()
        try:
            for data in _sse_data(response.iter_lines()):
                if data.strip() == "[DONE]":
                    assembly.done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    raise LLMResponseError(
                        f"stream chunk is not JSON: {data[:_EXCERPT_CHARS]}"
                    ) from None
                if isinstance(chunk, dict):
                    assembly.add(chunk)
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                f"the stream broke off: {type(exc).__name__}", attempts=attempts
            ) from None
        return assembly.result()
