"""The backend of a Live session's Responses delegation: any OpenAI-compatible server, as Responses streaming events.

Where the server has the Responses API (``POST /responses``, streamed), its events are passed on as they come.
Where it has only chat completions (vLLM's older builds, llama.cpp, most local servers), the chat stream is turned
into the Responses events a client of OpenAI's expects: ``response.created``, the message's ``output_item`` and
``output_text`` events, each function call as an ``output_item.done`` item, ``response.completed`` with usage.
``[live] delegation_api`` chooses; "auto" tries the Responses API and falls back to chat completions for good once
the server answers 404 or 405 to it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from gateway.config import Config, api_key
from gateway.core.ids import new_id
from gateway.live.effects import DelegationRequest
from gateway.responders.openai_http import HttpStatusError, OpenAIServer, events

log = logging.getLogger(__name__)


class DelegationError(Exception):
    """The backend failed; the message says how, briefly."""


class DelegationBackend:
    def __init__(self, base_url: str, api_key_value: str, api: str, timeout_s: float) -> None:
        self.api = api  # "responses", "chat" or "auto" (until the server has answered)
        self._server = OpenAIServer(base_url, api_key_value, timeout_s)

    @classmethod
    def from_config(cls, config: Config) -> DelegationBackend | None:
        """The configured backend ([live] delegation_base_url, else [llm] base_url), None when neither is set."""
        live = config.live
        base_url = live.delegation_base_url or config.llm.base_url
        if not base_url:
            return None
        key = api_key(live.delegation_api_key_env) or api_key(config.llm.api_key_env)
        return cls(base_url, key, live.delegation_api, live.delegation_timeout_s)

    async def aclose(self) -> None:
        await self._server.aclose()

    async def run(self, request: DelegationRequest) -> AsyncIterator[dict[str, Any]]:
        """The run's Responses streaming events; DelegationError if the backend fails."""
        if self.api != "chat":
            try:
                stream = await self._server.post("responses", body=_responses_body(request))
            except HttpStatusError as exc:
                if self.api == "auto" and exc.status in (404, 405):
                    log.info("the delegation backend has no Responses API: chat completions from now on")
                    self.api = "chat"
                else:
                    raise DelegationError(self._server.cause(exc)) from exc
            except Exception as exc:
                raise DelegationError(self._server.cause(exc)) from exc
            else:
                if self.api == "auto":
                    self.api = "responses"
                async for event in _events(stream, self._server):
                    yield event
                return
        try:
            stream = await self._server.post("chat/completions", body=_chat_body(request))
        except Exception as exc:
            raise DelegationError(self._server.cause(exc)) from exc
        async for event in _from_chat(stream, request, self._server):
            yield event


async def _events(stream: aiohttp.ClientResponse, server: OpenAIServer) -> AsyncIterator[dict[str, Any]]:
    try:
        async for event in events(stream):
            if isinstance(event, dict) and isinstance(event.get("type"), str):
                yield event
    except Exception as exc:
        raise DelegationError(f"stream broken: {server.cause(exc)}") from exc
    finally:
        stream.release()


def _responses_body(request: DelegationRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model, "input": request.input, "stream": True}
    for name in ("instructions", "tool_choice", "parallel_tool_calls", "reasoning", "text", "max_output_tokens",
                 "service_tier"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    if tools := [t for t in request.tools if t.get("type") == "function"]:
        body["tools"] = tools
    return body


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _chat_body(request: DelegationRequest) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for item in request.input:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _text_of(output)})
        else:
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            messages.append({"role": role, "content": _text_of(item.get("content"))})
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
             for t in request.tools if t.get("type") == "function"]
    if tools:
        body["tools"] = tools
        choice = request.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            choice = {"type": "function", "function": {"name": choice["name"]}}
        body["tool_choice"] = choice if choice is not None else "auto"
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    return body


async def _from_chat(stream: aiohttp.ClientResponse, request: DelegationRequest,
                     server: OpenAIServer) -> AsyncIterator[dict[str, Any]]:
    """A chat completions stream as Responses streaming events."""
    seq = itertools.count()
    response: dict[str, Any] = {"id": new_id("resp"), "object": "response", "created_at": int(time.time()),
                                "status": "in_progress", "model": request.model, "output": [], "usage": None}

    def out(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    yield out("response.created", response=dict(response))
    yield out("response.in_progress", response=dict(response))
    message_id, text, index = new_id("msg"), "", 0
    calls: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    try:
        async for chunk in events(stream):
            if not isinstance(chunk, dict):
                raise DelegationError(f"not a chat.completion.chunk: {str(chunk)[:80]}")
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices")
            delta = (choices[0].get("delta") if choices else None) or {}
            if content := delta.get("content"):
                if not text:
                    item = {"id": message_id, "type": "message", "role": "assistant", "status": "in_progress",
                            "content": []}
                    yield out("response.output_item.added", output_index=0, item=item)
                    yield out("response.content_part.added", item_id=message_id, output_index=0, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": []})
                text += content
                yield out("response.output_text.delta", item_id=message_id, output_index=0, content_index=0,
                          delta=content, logprobs=[])
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                entry = calls.setdefault(call.get("index", 0), {"call_id": call.get("id") or new_id("call"),
                                                               "name": "", "arguments": ""})
                entry["name"] += function.get("name") or ""
                entry["arguments"] += function.get("arguments") or ""
    except DelegationError:
        raise
    except Exception as exc:
        raise DelegationError(f"stream broken: {server.cause(exc)}") from exc
    finally:
        stream.release()
    output: list[dict[str, Any]] = []
    if text:
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": message_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
        yield out("response.output_text.done", item_id=message_id, output_index=0, content_index=0, text=text,
                  logprobs=[])
        yield out("response.content_part.done", item_id=message_id, output_index=0, content_index=0, part=part)
        yield out("response.output_item.done", output_index=0, item=item)
        output.append(item)
        index = 1
    for offset, call in enumerate(calls[i] for i in sorted(calls)):
        item_id = new_id("fc")
        item = {"id": item_id, "type": "function_call", "call_id": call["call_id"], "name": call["name"],
                "arguments": call["arguments"], "status": "in_progress"}
        yield out("response.output_item.added", output_index=index + offset, item=item)
        yield out("response.function_call_arguments.done", item_id=item_id, output_index=index + offset,
                  arguments=call["arguments"])
        done = {**item, "status": "completed"}
        yield out("response.output_item.done", output_index=index + offset, item=done)
        output.append(done)
    response.update(status="completed", output=output)
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        completion = usage.get("completion_tokens") or 0
        response["usage"] = {"input_tokens": usage["prompt_tokens"], "output_tokens": completion,
                             "total_tokens": usage["prompt_tokens"] + completion,
                             "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}
    yield out("response.completed", response=response)
