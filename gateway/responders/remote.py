"""STT and LLM clients of the pipeline: any OpenAI-compatible server, over HTTP (openai_http.py).

A voice turn cannot wait for retries, so the clients never retry: every failure becomes a ``BackendError`` at
once, naming the backend and a short cause, and the response fails.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson

from gateway.audio import wav_bytes
from gateway.config import LlmConfig, SttConfig, api_key, redacted_url
from gateway.core.responder import BackendError, LlmUsage, Message, ReplyCut, ToolCallArguments, ToolCallStart
from gateway.realtime.events import new_id
from gateway.responders.openai_http import OpenAIServer, events


def chat_messages(instructions: str, messages: Sequence[Message], audio_in: bool = False) -> list[dict[str, Any]]:
    """The chat prompt: the session instructions, then the conversation so far.

    Items without text are left out (an assistant turn interrupted before anything was heard, a
    user turn whose transcription failed), except user audio in audio-in mode, which goes to the
    model as an ``input_audio`` part. A user message's pictures go as ``image_url`` parts (for a vision
    model). An assistant message's tool calls follow its text, each call's result in a ``tool`` message
    right after it, as chat completions require.
    """
    prompt: list[dict[str, Any]] = []
    if instructions:
        prompt.append({"role": "system", "content": instructions})
    for m in messages:
        if m.tool_calls:
            calls = [{"id": c.call_id, "type": "function",
                      "function": {"name": c.name, "arguments": c.arguments or "{}"}} for c in m.tool_calls]
            prompt.append({"role": "assistant", "content": m.text or None, "tool_calls": calls})
            prompt += [{"role": "tool", "tool_call_id": c.call_id, "content": c.output} for c in m.tool_calls]
        elif m.images:  # a vision model's parts: the text, then each picture
            parts = [{"type": "text", "text": m.text}] if m.text else []
            parts += [{"type": "image_url", "image_url": {"url": url, "detail": detail}} for url, detail in m.images]
            prompt.append({"role": m.role, "content": parts})
        elif m.text:
            prompt.append({"role": m.role, "content": m.text})
        elif audio_in and m.role == "user" and m.audio:
            data = base64.b64encode(wav_bytes(m.audio)).decode("ascii")
            part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
            prompt.append({"role": "user", "content": [part]})
    return prompt


class SttClient:
    """Transcription through POST {base_url}/audio/transcriptions.

    With ``stream`` the request asks for a stream (OpenAI's ``stream=true``) and the text comes as the
    server sends it: OpenAI's ``transcript.text.delta`` / ``.done`` events, or vLLM's
    ``transcription.chunk`` ones; a server that ignores the flag and answers whole is read whole.
    """

    def __init__(
        self, base_url: str, model: str, api_key_env: str = "", language: str = "", timeout_s: float = 10.0,
        stream: bool = False,
    ) -> None:
        self.model = model
        self.language = language
        self.stream = stream
        self._server = OpenAIServer(base_url, api_key(api_key_env), timeout_s)

    @classmethod
    def from_config(cls, config: SttConfig) -> SttClient:
        return cls(config.base_url, config.model, config.api_key_env, config.language, config.timeout_s,
                   config.stream)

    async def transcribe(
        self, pcm16_24k: bytes, language: str | None = None, prompt: str | None = None
    ) -> AsyncIterator[str]:
        """Pieces of the transcript as the server gives them (see gateway.core.responder.Transcriber)."""
        form = aiohttp.FormData()
        form.add_field("model", self.model)
        if language := language or self.language:
            form.add_field("language", language)
        if prompt:
            form.add_field("prompt", prompt)
        if self.stream:
            form.add_field("stream", "true")
        form.add_field("file", wav_bytes(pcm16_24k), filename="audio.wav", content_type="audio/wav")
        try:
            response = await self._server.post("audio/transcriptions", form=form)
        except Exception as exc:  # whatever broke, the turn fails as an STT failure
            raise BackendError("stt", self._server.cause(exc)) from exc
        streamed = response.content_type.startswith("text/event-stream")
        try:
            if not streamed:
                yield _whole_text(await response.read())
                return
            sent = ""
            async for event in events(response):
                piece = _stream_piece(event, sent)
                if piece:
                    sent += piece
                    yield piece
        except Exception as exc:
            broken = "stream broken: " if streamed else ""
            raise BackendError("stt", f"{broken}{self._server.cause(exc)}") from exc
        finally:
            response.release()

    @property
    def where(self) -> str:
        return redacted_url(self._server.base_url)  # for logs: a password in the URL stays out of them

    async def check(self) -> str | None:
        return await self._server.check()

    async def aclose(self) -> None:
        await self._server.aclose()


def _stream_piece(event: object, sent: str) -> str:
    """The new text in one streamed transcription event, given the text ``sent`` so far."""
    if not isinstance(event, dict):
        raise ValueError(f"not a transcription event: {str(event)[:80]}")
    kind = event.get("type")
    if kind == "transcript.text.delta":
        return event.get("delta") or ""
    if kind == "transcript.text.done":
        text = event.get("text") or ""
        return text[len(sent):] if text.startswith(sent) else ""
    choices = event.get("choices")  # vLLM: chat-completion-like chunks
    return ((choices[0].get("delta") or {}).get("content") or "") if choices else ""


def _whole_text(body: bytes) -> str:
    """The text of a whole (not streamed) answer: OpenAI's JSON {"text": ...}, or plain text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise ValueError(f"not a transcription: {body[:80]!r}")
    return data["text"]


class LlmClient:
    """Streamed chat completions through POST {base_url}/chat/completions."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "",
        temperature: float = 0.7,
        max_output_tokens: int = 512,
        timeout_s: float = 30.0,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self._server = OpenAIServer(base_url, api_key(api_key_env), timeout_s)

    @classmethod
    def from_config(cls, config: LlmConfig) -> LlmClient:
        return cls(
            config.base_url,
            config.model,
            config.api_key_env,
            config.temperature,
            config.max_output_tokens,
            config.timeout_s,
        )

    async def stream_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
    ) -> AsyncIterator[str | ToolCallStart | ToolCallArguments | LlmUsage | ReplyCut]:
        """The reply as it streams in: text deltas, tool calls (as vLLM and OpenAI stream them: a call's id
        and name first, then pieces of its arguments), and last the token counts if the server sends them.

        Closing the iterator (aclose, or cancelling the task iterating it) closes the HTTP stream,
        so the server stops generating.
        """
        limit = self.max_output_tokens
        if max_output_tokens is not None:
            limit = min(limit, max_output_tokens)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": limit,
            "temperature": self.temperature if temperature is None else temperature,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = tool_choice or "auto"
            if parallel_tool_calls is not None:
                body["parallel_tool_calls"] = parallel_tool_calls
        try:
            response = await self._server.post("chat/completions", body=body)
        except Exception as exc:
            raise BackendError("llm", self._server.cause(exc)) from exc
        calls: set[int] = set()
        usage: dict[str, Any] | None = None
        cut = False
        try:
            async for chunk in events(response):
                if not isinstance(chunk, dict):
                    raise ValueError(f"not a chat.completion.chunk: {str(chunk)[:80]}")
                # Usage comes in a last chunk without choices (some servers repeat it in every chunk).
                usage = chunk.get("usage") or usage
                # Some servers send a null delta.
                choices = chunk.get("choices")
                cut = cut or bool(choices) and choices[0].get("finish_reason") == "length"
                delta = (choices[0].get("delta") if choices else None) or {}
                if content := delta.get("content"):
                    yield content
                for call in delta.get("tool_calls") or ():
                    index = call.get("index", 0)
                    function = call.get("function") or {}
                    if index not in calls:
                        calls.add(index)
                        # Our own id, not the server's: some servers number calls anew each turn ("call_0"),
                        # and a call_id must name one call in the conversation.
                        yield ToolCallStart(index, new_id("call"), function.get("name") or "")
                    if arguments := function.get("arguments"):
                        yield ToolCallArguments(index, arguments)
        except Exception as exc:  # a dropped connection, a stall, an error event, a malformed chunk
            raise BackendError("llm", f"stream broken: {self._server.cause(exc)}") from exc
        finally:
            # Back to the pool when the body was read to its end; else the connection is closed, and the
            # server stops generating.
            response.release()
        if cut:
            yield ReplyCut()
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            yield LlmUsage(usage["prompt_tokens"], usage.get("completion_tokens") or 0,
                           cached if isinstance(cached, int) else None)

    @property
    def where(self) -> str:
        return redacted_url(self._server.base_url)  # for logs: a password in the URL stays out of them

    async def check(self) -> str | None:
        return await self._server.check()

    async def aclose(self) -> None:
        await self._server.aclose()
