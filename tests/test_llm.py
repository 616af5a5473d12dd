"""The OpenAI-compatible client against a real scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from scripted_llm import ScriptedLLMServer, SSEStream, chat_reply, content_chunks

from host_kernel.llm import (
    ChatClient,
    LLMClient,
    LLMConfig,
    LLMConfigError,
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMStatusError,
    ToolCall,
    Usage,
    retry_delay,
)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


@pytest.fixture
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as scripted:
        yield scripted


def config_for(server: ScriptedLLMServer, **overrides: object) -> LLMConfig:
    settings: dict[str, object] = {"timeout": 5.0, "max_retries": 3, "backoff": 0.001}
    settings.update(overrides)
    return LLMConfig(server.base_url, "test-model", **settings)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- replies


def test_plain_reply_is_parsed_and_the_request_is_openai_shaped(server: ScriptedLLMServer) -> None:
    server.push(chat_reply("Hello.", usage=USAGE))
    with LLMClient(config_for(server)) as client:
        result = client.chat(MESSAGES, max_tokens=50, temperature=0.0)
    assert result.content == "Hello."
    assert result.tool_calls == ()
    assert result.finish_reason == "stop"
    assert result.usage == Usage(11, 3, 14)
    assert result.model == "scripted-model"
    assert isinstance(result.raw, dict) and result.raw["id"] == "chatcmpl-scripted"
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {
        "model": "test-model",
        "messages": MESSAGES,
        "max_tokens": 50,
        "temperature": 0.0,
    }


def test_usage_is_none_when_the_server_does_not_report_it(server: ScriptedLLMServer) -> None:
    server.push(chat_reply("ok"))
    with LLMClient(config_for(server)) as client:
        assert client.chat(MESSAGES).usage is None


def test_usage_total_is_derived_when_only_the_parts_are_given(server: ScriptedLLMServer) -> None:
    server.push(chat_reply("ok", usage={"prompt_tokens": 2, "completion_tokens": 5}))
    with LLMClient(config_for(server)) as client:
        assert client.chat(MESSAGES).usage == Usage(2, 5, 7)


def test_tool_calls_are_parsed_and_bad_arguments_are_flagged(server: ScriptedLLMServer) -> None:
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "run", "arguments": '{"code": "1+1"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "run", "arguments": "{not json"}},
        {"id": "c3", "type": "function", "function": {"name": "noargs", "arguments": ""}},
    ]
    server.push(chat_reply(None, tool_calls=calls, finish_reason="tool_calls"))
    with LLMClient(config_for(server)) as client:
        result = client.chat(MESSAGES, tools=tools)
    assert server.requests[0].json()["tools"] == tools
    assert result.content == ""
    assert result.finish_reason == "tool_calls"
    first, second, third = result.tool_calls
    assert first == ToolCall("c1", "run", {"code": "1+1"}, '{"code": "1+1"}')
    assert second.arguments == {} and second.raw_arguments == "{not json"
    assert second.arguments_error is not None and "not valid JSON" in second.arguments_error
    assert third.arguments == {} and third.arguments_error is None


def test_a_2xx_body_that_is_not_a_completion_is_a_response_error(
    server: ScriptedLLMServer,
) -> None:
    server.push((200, "<html>gateway</html>"), {"object": "chat.completion", "choices": []})
    with LLMClient(config_for(server)) as client:
        with pytest.raises(LLMResponseError, match="not JSON"):
            client.chat(MESSAGES)
        with pytest.raises(LLMResponseError, match="no choices"):
            client.chat(MESSAGES)
    assert len(server.requests) == 2  # neither is retried


# --------------------------------------------------------------------------- streaming


def test_streamed_content_and_tool_call_deltas_are_assembled(server: ScriptedLLMServer) -> None:
    def delta(d: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {"model": "m-1", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    def tool(index: int, **function: str) -> dict[str, object]:
        piece: dict[str, object] = {"index": index, "function": function}
        if "name" in function:
            piece["id"] = f"call_{index}"
            piece["type"] = "function"
        return delta({"tool_calls": [piece]})

    server.push(
        [
            delta({"role": "assistant", "content": ""}),
            delta({"content": "Let me "}),
            delta({"content": "check."}),
            tool(0, name="host_bash", arguments=""),
            tool(1, name="host_read", arguments='{"pa'),
            tool(0, arguments='{"command": '),
            tool(1, arguments='th": "a.txt"}'),
            tool(0, arguments='"pytest -q"}'),
            delta({}, finish="tool_calls"),
            {"model": "m-1", "choices": [], "usage": USAGE},
        ]
    )
    with LLMClient(config_for(server)) as client:
        result = client.chat(MESSAGES, stream=True)
    assert result.content == "Let me check."
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(11, 3, 14)
    assert result.model == "m-1"
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_0", "host_bash", {"command": "pytest -q"}),
        ("call_1", "host_read", {"path": "a.txt"}),
    ]
    assert isinstance(result.raw, list) and len(result.raw) == 10
    request = server.requests[0]
    assert request.headers["accept"] == "text/event-stream"
    body = request.json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_streamed_usage_is_none_when_no_chunk_carries_it(server: ScriptedLLMServer) -> None:
    server.push(content_chunks("a", "b"))
    with LLMClient(config_for(server)) as client:
        result = client.chat(MESSAGES, stream=True)
    assert (result.content, result.usage, result.finish_reason) == ("ab", None, "stop")


def test_sse_comments_and_event_lines_are_ignored(server: ScriptedLLMServer) -> None:
    text = (
        ": keep-alive\n\nevent: message\n"
        'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
        'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        "data: [DONE]\n\n"
    )
    server.push((200, text, {"Content-Type": "text/event-stream"}))
    with LLMClient(config_for(server)) as client:
        assert client.chat(MESSAGES, stream=True).content == "x"


def test_a_stream_cut_before_done_and_finish_is_an_error(server: ScriptedLLMServer) -> None:
    server.push(
        SSEStream(content_chunks("partial")[:-1], done=False),
        SSEStream(content_chunks("whole"), done=False),  # finished, just no [DONE]
    )
    with LLMClient(config_for(server)) as client:
        with pytest.raises(LLMResponseError, match="before \\[DONE\\]"):
            client.chat(MESSAGES, stream=True)
        assert client.chat(MESSAGES, stream=True).content == "whole"


def test_a_server_that_ignores_stream_true_is_read_whole(server: ScriptedLLMServer) -> None:
    server.push(chat_reply("whole body", usage=USAGE))
    with LLMClient(config_for(server)) as client:
        result = client.chat(MESSAGES, stream=True)
    assert (result.content, result.usage) == ("whole body", Usage(11, 3, 14))


def test_a_redirect_is_an_error_not_a_reply(server: ScriptedLLMServer) -> None:
    server.push((307, "", {"Location": "http://elsewhere/v1/chat/completions"}))
    with LLMClient(config_for(server)) as client, pytest.raises(LLMStatusError) as caught:
        client.chat(MESSAGES)
    assert caught.value.status == 307 and caught.value.attempts == 1


def test_an_error_event_inside_a_stream_is_raised(server: ScriptedLLMServer) -> None:
    server.push([{"error": {"message": "model overloaded", "type": "server_error"}}])
    with (
        LLMClient(config_for(server)) as client,
        pytest.raises(LLMResponseError, match="model overloaded"),
    ):
        client.chat(MESSAGES, stream=True)


def test_a_stream_request_is_retried_on_503(server: ScriptedLLMServer) -> None:
    server.push(SSEStream([], status=503, done=False), content_chunks("ok"))
    with LLMClient(config_for(server)) as client:
        assert client.chat(MESSAGES, stream=True).content == "ok"
    assert len(server.requests) == 2


# --------------------------------------------------------------------------- retries


def test_429_is_retried_then_succeeds(server: ScriptedLLMServer) -> None:
    server.push((429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}), chat_reply("ok"))
    with LLMClient(config_for(server)) as client:
        assert client.chat(MESSAGES).content == "ok"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


def test_retry_after_is_honoured(server: ScriptedLLMServer) -> None:
    server.push((429, "busy", {"Retry-After": "0.3"}), chat_reply("ok"))
    started = time.monotonic()
    with LLMClient(config_for(server, backoff=0.0)) as client:
        client.chat(MESSAGES)
    assert time.monotonic() - started >= 0.3


def test_retry_after_is_capped(server: ScriptedLLMServer) -> None:
    server.push((503, "down", {"Retry-After": "3600"}), chat_reply("ok"))
    started = time.monotonic()
    with LLMClient(config_for(server, max_backoff=0.05)) as client:
        assert client.chat(MESSAGES).content == "ok"
    assert time.monotonic() - started < 2.0


def test_5xx_exhausting_retries_raises_a_status_error(server: ScriptedLLMServer) -> None:
    server.push(*[(500, {"error": "boom"})] * 3)
    with (
        LLMClient(config_for(server, max_retries=2)) as client,
        pytest.raises(LLMStatusError) as caught,
    ):
        client.chat(MESSAGES)
    error = caught.value
    assert (error.status, error.attempts, error.retryable) == (500, 3, True)
    assert "boom" in error.body_excerpt
    assert "(3 attempts)" in str(error)
    assert len(server.requests) == 3 and server.remaining == 0


def test_400_is_not_retried(server: ScriptedLLMServer) -> None:
    server.push((400, {"error": {"message": "context_length_exceeded"}}), chat_reply("unused"))
    with LLMClient(config_for(server)) as client, pytest.raises(LLMStatusError) as caught:
        client.chat(MESSAGES)
    assert caught.value.status == 400 and caught.value.attempts == 1
    assert not caught.value.retryable
    assert "context_length_exceeded" in str(caught.value)
    assert len(server.requests) == 1


def test_long_error_bodies_are_cut_to_an_excerpt(server: ScriptedLLMServer) -> None:
    server.push((404, "x" * 5000))
    with LLMClient(config_for(server)) as client, pytest.raises(LLMStatusError) as caught:
        client.chat(MESSAGES)
    assert len(caught.value.body_excerpt) <= 301


def test_connection_errors_are_retried_then_reported() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = LLMConfig(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff=0.001)
    with LLMClient(config) as client, pytest.raises(LLMConnectionError) as caught:
        client.chat(MESSAGES)
    assert caught.value.attempts == 3


def test_retry_delay_doubles_and_is_capped() -> None:
    config = LLMConfig("http://x/v1", "m", backoff=0.5, max_backoff=3.0)
    assert [retry_delay(config, n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert retry_delay(config, 0, "2") == 2.0
    assert retry_delay(config, 0, "120") == 3.0
    assert retry_delay(config, 1, "soon") == 1.0  # unreadable: fall back to backoff
    assert retry_delay(config, 0, "-5") == 0.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    assert retry_delay(config, 0, later) == 3.0


# --------------------------------------------------------------------------- the key


def test_authorization_carries_the_key_read_from_env_at_call_time(
    server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.push(chat_reply("one"), chat_reply("two"))
    with LLMClient(config_for(server, api_key_env="HK_TEST_KEY")) as client:
        monkeypatch.setenv("HK_TEST_KEY", "sk-first")
        client.chat(MESSAGES)
        monkeypatch.setenv("HK_TEST_KEY", "sk-second")
        client.chat(MESSAGES)
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-first",
        "Bearer sk-second",
    ]


def test_the_key_can_come_from_a_file_read_at_call_time(
    server: ScriptedLLMServer, tmp_path: Path
) -> None:
    key = tmp_path / "llm.key"
    key.write_text("sk-file-one\n")
    server.push(chat_reply("one"), chat_reply("two"))
    with LLMClient(config_for(server, api_key_file=str(key))) as client:
        client.chat(MESSAGES)
        key.write_text("sk-file-two")
        client.chat(MESSAGES)
        key.unlink()
        with pytest.raises(LLMConfigError, match="cannot read the API key file"):
            client.chat(MESSAGES)
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-file-one", "Bearer sk-file-two"]
    with pytest.raises(LLMConfigError, match="not both"):
        config_for(server, api_key_file=str(key), api_key_env="X")


def test_no_key_variable_means_no_authorization_header(server: ScriptedLLMServer) -> None:
    server.push(chat_reply("ok"))
    with LLMClient(config_for(server)) as client:
        client.chat(MESSAGES)
    assert "authorization" not in server.requests[0].headers


def test_an_unset_key_variable_fails_before_any_request(
    server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HK_TEST_KEY", raising=False)
    with (
        LLMClient(config_for(server, api_key_env="HK_TEST_KEY")) as client,
        pytest.raises(LLMConfigError, match="HK_TEST_KEY"),
    ):
        client.chat(MESSAGES)
    assert server.requests == []


def test_the_key_never_appears_in_errors(
    server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-very-secret-value"
    monkeypatch.setenv("HK_TEST_KEY", secret)
    server.push((401, {"error": f"invalid key {secret}"}))
    with (
        LLMClient(config_for(server, api_key_env="HK_TEST_KEY")) as client,
        pytest.raises(LLMStatusError) as caught,
    ):
        client.chat(MESSAGES)
    assert secret not in repr(client.config)
    assert secret not in str(caught.value) and "[redacted]" in str(caught.value)
    assert secret not in caught.value.body_excerpt


# --------------------------------------------------------------------------- lifecycle


def test_a_closed_client_refuses_to_chat(server: ScriptedLLMServer) -> None:
    client = LLMClient(config_for(server))
    client.close()
    client.close()  # twice is fine
    assert client.closed
    with pytest.raises(LLMError, match="closed"):
        client.chat(MESSAGES)


@pytest.mark.parametrize(
    "overrides",
    [
        {"base_url": "127.0.0.1:8000/v1"},
        {"model": ""},
        {"api_key_env": ""},
        {"timeout": 0},
        {"max_retries": -1},
        {"backoff": -1.0},
    ],
)
def test_bad_config_is_refused(overrides: dict[str, object]) -> None:
    settings: dict[str, object] = {"base_url": "http://x/v1", "model": "m"}
    settings.update(overrides)
    with pytest.raises(LLMConfigError):
        LLMConfig(**settings)  # type: ignore[arg-type]


def test_values_are_frozen_and_the_client_meets_the_protocol(server: ScriptedLLMServer) -> None:
    config = config_for(server)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "other"  # type: ignore[misc]
    with LLMClient(config) as client:
        as_protocol: ChatClient = client
        assert as_protocol is client
    assert config.endpoint == server.base_url + "/chat/completions"
