"""A session's responses: response.create read, the response's output turned into events, its end.

One response is active at a time. It produces one assistant message item; what its responder yields
(speech text, audio, text) becomes deltas on that item, and ``finish`` closes the open parts and
sends response.done. Anything yielded for a response that is no longer active is dropped here, so
nothing of a cancelled response follows its response.done.

A truncate does not end the response (the client cancels if it wants to): what the response yields
after it still goes out as deltas, but the item keeps only what was heard up to the truncation.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from gateway.audio import OutputEncoder
from gateway.conversation import BYTES_PER_MS, Conversation, EventMaker, Item, snapshot
from gateway.effects import Effect, Mark, Play, PlayoutEnd, StartResponse, StopResponse
from gateway.protocol import (
    Dialect,
    ProtocolError,
    SessionSettings,
    check_voice,
    field_of,
    format_wire,
    new_id,
    non_empty,
    parse_item,
    parse_metadata,
    parse_prompt,
    parse_reasoning,
    parse_temperature,
    response_format,
)
from gateway.responder import AudioOut, ResponseOutput, ResponseRequest, SpeechText, TextOut, TraceMark


@dataclass
class Response:
    id: str
    item: Item  # the assistant message it produces
    modalities: list[str]
    voice: str
    output_format: str
    in_conversation: bool
    max_output_tokens: int | str
    metadata: dict[str, Any] | None
    encoder: OutputEncoder
    transcript: list[str] = field(default_factory=list)
    audio_ms: float = 0.0

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities


class Responses:
    def __init__(self, event: EventMaker, conversation: Conversation, dialect: Dialect, server_playout: bool) -> None:
        self._event = event
        self._conversation = conversation
        self._dialect = dialect
        self._server_playout = server_playout
        self.active: Response | None = None
        self.voice_locked = False  # audio has gone out: the session's voice is fixed

    def start(self, params: dict[str, Any], settings: SessionSettings, voices: frozenset[str] | None) -> list[Effect]:
        """A new response from response.create's ``response`` (or {} for a turn's automatic one)."""
        if self.active is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.active.id}. "
                "Wait until the response is finished before creating a new one.",
            )
        s = settings
        if self._dialect is Dialect.GA:
            mods = field_of(params, "output_modalities", list, "response.output_modalities")
            audio = field_of(params, "audio", dict, "response.audio") or {}
            out = field_of(audio, "output", dict, "response.audio.output") or {}
            voice_param = "response.audio.output.voice"
            max_tokens = params.get("max_output_tokens")
            max_param = "response.max_output_tokens"
        else:
            mods = field_of(params, "modalities", list, "response.modalities")
            out = params
            voice_param = "response.voice"
            max_tokens = params.get("max_response_output_tokens")
            max_param = "response.max_response_output_tokens"
        voice = field_of(out, "voice", (str, dict) if self._dialect is Dialect.GA else str, voice_param)
        if isinstance(voice, dict):
            voice = non_empty(voice, "id", f"{voice_param}.id", required=True)
        if voice is not None:
            non_empty({"v": voice}, "v", voice_param)
            check_voice(voice, voices, voice_param)
        mods_param = "response.output_modalities" if self._dialect is Dialect.GA else "response.modalities"
        if mods is not None:
            for i, m in enumerate(mods):
                if m not in ("text", "audio"):
                    raise ProtocolError("invalid_value", f"Invalid modality {m!r}.", f"{mods_param}[{i}]")
            if not mods:
                raise ProtocolError("invalid_value", f"'{mods_param}' must not be empty.", mods_param)
        modalities = (["audio"] if "audio" in mods else ["text"]) if mods else s.modalities
        if max_tokens is not None and max_tokens != "inf" and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 4096
        ):
            raise ProtocolError("invalid_value", "max output tokens must be 1..4096 or \"inf\".", max_param)
        conversation = field_of(params, "conversation", str, "response.conversation")
        if conversation not in (None, "auto", "none"):
            raise ProtocolError("invalid_value", "'response.conversation' must be 'auto' or 'none'.",
                                "response.conversation")
        instructions = field_of(params, "instructions", str, "response.instructions")
        metadata = parse_metadata(params, "metadata", "response.metadata")
        if self._dialect is Dialect.GA:
            # Checked, not acted on: no stored prompts; the LLM backend's settings decide its reasoning.
            parse_prompt(params, "prompt", "response.prompt")
            parse_reasoning(params, "reasoning", "response.reasoning")
            temperature = s.temperature
        else:
            own = parse_temperature(params, "response.temperature")
            temperature = s.temperature if own is None else own
        output_format = response_format(params, self._dialect) or s.output_format
        # An out-of-band context replaces the conversation for this response ("input": items or references).
        context = self._input(params["input"]) if params.get("input") is not None else None

        part = {"type": "output_audio", "transcript": ""} if "audio" in modalities else {"type": "output_text",
                                                                                         "text": ""}
        item = Item({
            "id": new_id("item"), "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "in_progress", "content": [part],
        })
        resp = Response(
            id=new_id("resp"),
            item=item,
            modalities=modalities,
            voice=voice or s.voice,
            output_format=output_format,
            in_conversation=conversation != "none",
            max_output_tokens=max_tokens if max_tokens is not None else s.max_output_tokens,
            metadata=metadata,
            encoder=OutputEncoder(output_format),
        )
        item.response_id = resp.id
        request = ResponseRequest(
            response_id=resp.id,
            item_id=item.id,
            instructions=instructions if instructions is not None else s.instructions,
            messages=self._conversation.messages(context),
            voice=resp.voice,
            modalities=modalities,
            max_output_tokens=resp.max_output_tokens if isinstance(resp.max_output_tokens, int) else None,
            temperature=temperature,
        )
        self.active = resp
        effects: list[Effect] = [
            Mark("response_created", resp.id),
            self._event("response.created", response=self._wire(resp, "in_progress", [])),
            self._event("rate_limits.updated", rate_limits=[]),
            self._event("response.output_item.added", response_id=resp.id, output_index=0,
                        item={**snapshot(item.data), "content": []}),
        ]
        if resp.in_conversation:
            effects += self._conversation.insert(item, done=False) + self._conversation.make_room(keep=item)
        effects.append(self._event(
            "response.content_part.added", response_id=resp.id, item_id=item.id, output_index=0,
            content_index=0, part=self._part(resp, ""),
        ))
        effects.append(StartResponse(request))
        return effects

    def output(self, response_id: str, out: ResponseOutput) -> list[Effect]:
        """Something the responder of ``response_id`` produced; dropped if that response has ended."""
        resp = self.active
        if resp is None or resp.id != response_id:
            return []
        if isinstance(out, TraceMark):
            return [Mark(out.name, response_id)]
        item = resp.item
        if isinstance(out, AudioOut):
            if not resp.audio or not out.pcm:
                return []
            effects: list[Effect] = [] if resp.audio_ms else [Mark("first_delta", response_id)]
            self.voice_locked = True
            if not item.truncated:
                self._conversation.add_audio(item, out.pcm)
                effects += self._conversation.make_room(keep=item)
            resp.audio_ms += len(out.pcm) / BYTES_PER_MS
            if self._server_playout:
                effects.append(Play(resp.id, item.id, out.pcm))
                return effects
            encoded = resp.encoder.encode(out.pcm)
            if encoded:  # a G.711 resampler may hold all of a short chunk back
                effects.append(self._delta("response.output_audio.delta", resp, base64.b64encode(encoded).decode()))
            return effects
        if isinstance(out, SpeechText | TextOut) and out.text:
            if resp.audio and not item.truncated:
                item.marks.append((len(item.audio), sum(map(len, resp.transcript))))
            resp.transcript.append(out.text)
            kind = "response.output_audio_transcript.delta" if resp.audio else "response.output_text.delta"
            return [self._delta(kind, resp, out.text)]
        return []

    def finish(self, status: str, reason: str | None = None, error: dict[str, Any] | None = None) -> list[Effect]:
        """End the active response with ``status`` (completed, cancelled, failed): its closing events."""
        resp = self.active
        assert resp is not None
        self.active = None
        text = "".join(resp.transcript)
        data = resp.item.data
        data["status"] = "completed" if status == "completed" else "incomplete"
        if not resp.item.truncated:
            data["content"][0]["transcript" if resp.audio else "text"] = text
        self._conversation.recount(resp.item)
        effects: list[Effect] = []
        if status != "completed":
            effects.append(StopResponse(resp.id))
        if self._server_playout and resp.audio_ms:
            effects.append(PlayoutEnd(resp.id))
        common = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        # The encoder's resampler holds back its last few ms: they belong to a completed reply only.
        tail = resp.encoder.flush() if status == "completed" and not self._server_playout else b""
        if tail:
            effects.append(self._delta("response.output_audio.delta", resp, base64.b64encode(tail).decode()))
        if resp.audio:
            effects.append(self._event("response.output_audio.done", **common))
            effects.append(self._event("response.output_audio_transcript.done", **common, transcript=text))
        else:
            effects.append(self._event("response.output_text.done", **common, text=text))
        effects.append(self._event("response.content_part.done", **common, part=self._part(resp, text)))
        effects.append(self._event("response.output_item.done", response_id=resp.id, output_index=0,
                                   item=snapshot(data)))
        if resp.in_conversation:
            effects += self._conversation.done(resp.item) + self._conversation.make_room(keep=resp.item)
        details: dict[str, Any] | None = None
        if status != "completed":
            details = {"type": status, "reason": reason, "error": error}
        effects.append(self._event("response.done", response=self._wire(resp, status, [snapshot(data)], details)))
        effects.append(Mark("response_done", resp.id))
        return effects

    def sync_transcript(self) -> None:
        """The active item's transcript so far into the item (it is set whole at the end): a truncate
        cuts it at the words heard."""
        resp = self.active
        if resp is not None and resp.audio and not resp.item.truncated:
            resp.item.data["content"][0]["transcript"] = "".join(resp.transcript)

    def _input(self, value: Any) -> list[Item]:
        """response.input: the items a response sees instead of the conversation."""
        entries = field_of({"input": value}, "input", list, "response.input")
        context = []
        for i, entry in enumerate(entries):
            param = f"response.input[{i}]"
            body = field_of({"e": entry}, "e", dict, param, required=True)
            if body.get("type") == "item_reference":
                ref = field_of(body, "id", str, f"{param}.id", required=True)
                item = self._conversation.get(ref)
                if item is None:
                    raise ProtocolError("item_not_found", f"Item with id '{ref}' not found.", f"{param}.id")
                context.append(item)
            else:
                data = parse_item(body, param)
                for j, part in enumerate(data.get("content", [])):
                    if part.pop("audio", None):
                        raise ProtocolError("unsupported_content", "Audio in response.input is not supported; "
                                            "create the item first and reference it.", f"{param}.content[{j}]")
                context.append(Item(data))
        return context

    def _wire(
        self, resp: Response, status: str, output: list[dict[str, Any]], details: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "id": resp.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "conversation_id": self._conversation.id if resp.in_conversation else None,
            "output_modalities": resp.modalities,
            "max_output_tokens": resp.max_output_tokens,
            "metadata": resp.metadata,
            "audio": {"output": {"format": format_wire(resp.output_format), "voice": resp.voice}},
            "usage": None,
        }

    @staticmethod
    def _part(resp: Response, text: str) -> dict[str, Any]:
        if resp.audio:
            return {"type": "audio", "transcript": text}
        return {"type": "text", "text": text}

    def _delta(self, kind: str, resp: Response, delta: str) -> dict[str, Any]:
        return self._event(kind, response_id=resp.id, item_id=resp.item.id, output_index=0, content_index=0,
                           delta=delta)
