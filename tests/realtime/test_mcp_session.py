"""The session's side of MCP tools, sans-I/O: which servers are listed and what the LLM is offered, what an
approval runs, and the bounds a client cannot talk its way past."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.responder import ToolCallArguments, ToolCallStart
from gateway.realtime.effects import CallMcp, Effect, ListMcpTools, SendEvent, StartResponse
from gateway.realtime.session import Session
from gateway.realtime.tools import McpTool
from tests.conftest import make_config


def server(label: str = "w", url: str = "http://mcp.test/mcp", **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": "never", **fields}


def session() -> Session:
    return Session(make_config(mcp__allowed_hosts="mcp.test"))


def send(session: Session, event: dict[str, Any]) -> list[Effect]:
    return session.handle(orjson.dumps(event))


def update(session: Session, *tools: dict[str, Any], **fields: Any) -> list[Effect]:
    return send(session, {"type": "session.update", "session": {"type": "realtime", "tools": list(tools), **fields}})


def events(effects: list[Effect], kind: str) -> list[dict[str, Any]]:
    return [e.event for e in effects if isinstance(e, SendEvent) and e.event["type"] == kind]


def listings(effects: list[Effect]) -> list[ListMcpTools]:
    return [e for e in effects if isinstance(e, ListMcpTools)]


def offered(effects: list[Effect]) -> tuple[list[str], Any]:
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    return [t["function"]["name"] for t in start.request.tools], start.request.tool_choice


def tool(name: str) -> McpTool:
    return McpTool(name, {"type": "object"})


def test_an_approved_call_runs_once_whatever_becomes_of_its_item():
    s = session()
    (listing,) = listings(update(s, server(require_approval="always")))
    s.mcp_tools_listed(listing.item_id, [tool("pay")])
    (start,) = [e for e in send(s, {"type": "response.create"}) if isinstance(e, StartResponse)]
    rid = start.request.response_id
    s.response_output(rid, ToolCallStart(0, "call_1", "pay"))
    s.response_output(rid, ToolCallArguments(0, '{"amount": 100}'))
    (request,) = [o for o in events(s.response_finished(rid), "response.done")[0]["response"]["output"]]
    assert request["type"] == "mcp_approval_request"
    ran = send(s, {"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
    (call,) = [e for e in ran if isinstance(e, CallMcp)]  # at once, in a response of its own
    assert not any(isinstance(e, StartResponse) for e in ran)  # that response makes no LLM call
    s.mcp_call_finished(call.item_id, "paid")
    send(s, {"type": "conversation.item.delete", "item_id": call.item_id})
    again = send(s, {"type": "response.create"})
    assert not any(isinstance(e, CallMcp) for e in again)
    assert offered(again)[0] == ["pay"]


def test_a_header_the_connection_sets_is_refused():
    s = session()
    for name in ("Host", "content-length", "Transfer-Encoding", "Mcp-Session-Id"):
        (error,) = events(update(s, server(headers={name: "metadata.internal"})), "error")
        assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value",
                                                                     f"session.tools[0].headers.{name}")
    assert events(update(s, server(headers={"X-Api-Key": "k"})), "session.updated")


def test_listings_running_at_once_are_bounded_and_their_items_counted():
    s = session()
    eight = [server(f"s{i}") for i in range(8)]
    for round_ in range(2):
        assert len(listings(update(s, *[{**t, "headers": {"X-Round": str(round_)}} for t in eight]))) == 8
    effects = update(s, *[{**t, "headers": {"X-Round": "2"}} for t in eight])
    (error,) = events(effects, "error")
    assert error["error"]["code"] == "mcp_listings_busy" and not listings(effects)
    # A listing's tools count in the conversation's text: a server listing a lot of schema costs its size.
    s2 = session()
    (listing,) = listings(update(s2, server()))
    before = s2.conversation.text_bytes
    s2.mcp_tools_listed(listing.item_id, [McpTool(f"t{i}", {"type": "object", "description": "x" * 1000})
                                          for i in range(10)])
    assert s2.conversation.text_bytes - before > 10_000


def test_each_server_of_a_label_keeps_its_own_tools():
    """An out-of-band response naming the session's label with another URL lists that server beside the
    session's: the conversation's next response is offered the session's server's tools, and calls go there."""
    s = session()
    (a,) = listings(update(s, server(url="http://mcp.test/a")))
    s.mcp_tools_listed(a.item_id, [tool("read")])
    effects = send(s, {"type": "response.create", "response": {"conversation": "none",
                                                               "tools": [server(url="http://mcp.test/b")]}})
    (b,) = listings(effects)
    assert b.server.server_url == "http://mcp.test/b"
    s.mcp_tools_listed(b.item_id, [tool("other")])
    names, _ = offered(send(s, {"type": "response.create"}))
    assert names == ["read"]


def test_widening_allowed_tools_lists_the_server_again():
    s = session()
    (first,) = listings(update(s, server(allowed_tools=["echo"])))
    s.mcp_tools_listed(first.item_id, [tool("echo")])
    (second,) = listings(update(s, server()))
    s.mcp_tools_listed(second.item_id, [tool("echo"), tool("write")])
    assert offered(send(s, {"type": "response.create"}))[0] == ["echo", "write"]


def test_the_llm_is_offered_only_names_it_takes_and_a_chosen_servers_tools():
    s = session()
    time = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    effects = update(s, time, server("a"), server("b"), tool_choice={"type": "mcp", "server_label": "b"})
    first, second = listings(effects)
    s.mcp_tools_listed(first.item_id, [tool("from_a")])
    s.mcp_tools_listed(second.item_id, [tool("from_b"), tool("has space"), tool("x" * 65), tool("weird.name/v1")])
    names, choice = offered(send(s, {"type": "response.create"}))
    assert (names, choice) == (["from_b"], "required")
