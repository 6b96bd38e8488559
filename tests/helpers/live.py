"""The scripted models of the GPT-Live tests: the voice model that delegates, and the delegated backend."""

from __future__ import annotations

from typing import Any

from bench.fake_openai import Call, Script

SYSTEM = "When asked to check something, delegate to the client and speak the result."


def voice_model(body: dict[str, Any]) -> str | Script:
    """The voice LLM's replies: greet, delegate the user's request, speak a result it is told to."""
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "system" and "New instruction" in last["content"]:
        return "Hi!"
    if last["role"] == "system" and "in your own words" in last["content"]:
        return last["content"].rsplit(": ", 1)[-1]
    return Script("Okay, checking now.", [Call("delegate", {"task": "check the staging status"})])


def backend(body: dict[str, Any]) -> str | Script:
    """The delegated model: a weather call, then its answer from the output. Chat completions carry the
    output as a tool message, the Responses API as a function_call_output item."""
    if "messages" in body:  # the voice model, or the backend through chat completions
        if any(m["role"] == "tool" for m in body["messages"]):
            return "It is sunny in Paris."
        if body.get("model") == "gpt-5.6-terra":
            return Script("", [Call("get_weather", {"city": "Paris"})])
        return voice_model(body)
    if any(item.get("type") == "function_call_output" for item in body["input"]):
        return "It is sunny in Paris."
    return Script("", [Call("get_weather", {"city": "Paris"})])


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
