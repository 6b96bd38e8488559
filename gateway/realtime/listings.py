"""The MCP servers a session's tools name, and the tools each one listed.

Each server is listed once per label and connection (URL and headers), when a session.update or a
response.create first names it: an ``mcp_list_tools`` item joins the conversation, the runner lists the
server (the ListMcpTools effect), and ``finished`` fills the item in. A response whose tools name a
server still being listed waits for it (gateway/realtime/responses.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.realtime.conversation import Conversation, EventMaker, Item
from gateway.realtime.effects import Effect, ListMcpTools
from gateway.realtime.events import error_event, new_id
from gateway.realtime.tools import McpServer, McpTool, Tool


@dataclass
class Listing:
    server: McpServer
    item: Item
    tools: list[McpTool] | None = None  # None: still listing, or failed
    failed: bool = False


class McpListings:
    def __init__(self, event: EventMaker, conversation: Conversation) -> None:
        self._event = event
        self._conversation = conversation
        self._by_label: dict[str, Listing] = {}

    def refresh(self, tools: list[Tool]) -> list[Effect]:
        """List the servers among ``tools`` not listed yet (or listed with another URL or headers)."""
        effects: list[Effect] = []
        for server in tools:
            if not isinstance(server, McpServer):
                continue
            known = self._by_label.get(server.server_label)
            if known is not None and known.server.same_server(server) and not known.failed:
                continue
            item = Item({"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": server.server_label,
                         "tools": []})
            self._by_label[server.server_label] = Listing(server, item)
            effects += self._conversation.insert(item, done=False)
            effects.extend(self._event("mcp_list_tools.in_progress", item_id=item.id))
            effects.append(ListMcpTools(item.id, server))
        return effects

    def pending(self, tools: list[Tool]) -> set[str]:
        """The listings still running for the servers among ``tools`` (their item ids)."""
        listings = [self._by_label.get(t.server_label) for t in tools if isinstance(t, McpServer)]
        return {x.item.id for x in listings if x is not None and x.tools is None and not x.failed}

    def listed(self) -> dict[str, list[McpTool]]:
        """The tools each server listed, by server label."""
        return {label: listing.tools for label, listing in self._by_label.items() if listing.tools is not None}

    def finished(self, item_id: str, tools: list[McpTool] | None, error: str | None) -> list[Effect]:
        """The runner's listing for ``item_id``: the server's tools, or why listing failed."""
        listing = next((x for x in self._by_label.values() if x.item.id == item_id), None)
        if listing is None:
            return []  # replaced by a newer listing of that label meanwhile
        if tools is None:
            listing.failed = True
            # mcp_list_tools.failed carries no reason: an error event says it.
            message = f"Listing the tools of MCP server '{listing.server.server_label}' failed: {error}"
            error_body = error_event("mcp_list_tools_failed", message, error_type="server_error")["error"]
            return [*self._conversation.done(listing.item), *self._event("mcp_list_tools.failed", item_id=item_id),
                    *self._event("error", error=error_body)]
        listing.tools = tools
        listing.item.data["tools"] = [t.wire() for t in tools]
        return [*self._conversation.done(listing.item), *self._event("mcp_list_tools.completed", item_id=item_id)]
