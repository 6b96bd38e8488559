"""The MCP servers a session's tools name, and the tools each one listed.

Each server is listed once per label, connection (URL and headers) and allowed tools (its ``key``), when a
session.update or a response.create first names it: an ``mcp_list_tools`` item joins the conversation, the
runner lists the server (the ListMcpTools effect), and ``finished`` fills the item in. A response whose
tools name a server still being listed waits for it (gateway/realtime/responses.py).

A client picks the servers, so what they cost is bounded: at most ``max_running`` listings run at once (a
session.update or response.create that would start more is refused, changing nothing), at most
``max_kept`` are kept (the oldest finished one goes; a server named again is listed again), and each
listing item counts in the conversation's text with its tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.realtime.conversation import Conversation, EventMaker, Item
from gateway.realtime.effects import Effect, ListMcpTools
from gateway.realtime.events import ProtocolError, error_event, new_id
from gateway.realtime.tools import McpServer, McpTool, Tool


@dataclass
class Listing:
    server: McpServer
    item: Item
    tools: list[McpTool] | None = None  # None: still listing, or failed
    failed: bool = False

    @property
    def running(self) -> bool:
        return self.tools is None and not self.failed


class McpListings:
    def __init__(self, event: EventMaker, conversation: Conversation, max_servers: int) -> None:
        """``max_servers``: the MCP servers one tools array may name ([mcp] max_servers)."""
        self._event = event
        self._conversation = conversation
        self.max_running = 2 * max_servers
        self.max_kept = 4 * max_servers
        self._by_key: dict[tuple[Any, ...], Listing] = {}

    def _wanted(self, tools: list[Tool]) -> list[McpServer]:
        """The servers among ``tools`` with no listing, or a failed one."""
        return [t for t in tools if isinstance(t, McpServer)
                and ((known := self._by_key.get(t.key)) is None or known.failed)]

    def check(self, tools: list[Tool], param: str) -> None:
        """Refuse ``tools`` when listing their new servers would take the session past ``max_running``."""
        running = sum(listing.running for listing in self._by_key.values())
        if wanted := self._wanted(tools):
            if running + len(wanted) > self.max_running:
                raise ProtocolError("mcp_listings_busy", f"{running} MCP server listings are running in this "
                                    f"session and these tools need {len(wanted)} more; at most {self.max_running} "
                                    "run at once: wait for mcp_list_tools.completed first.", param)

    def refresh(self, tools: list[Tool]) -> list[Effect]:
        """List the servers among ``tools`` not listed yet (or whose listing failed)."""
        effects: list[Effect] = []
        for server in self._wanted(tools):
            item = Item({"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": server.server_label,
                         "tools": []})
            self._by_key.pop(server.key, None)
            self._by_key[server.key] = Listing(server, item)
            effects += self._conversation.insert(item, done=False) + self._conversation.make_room(keep=item)
            effects.extend(self._event("mcp_list_tools.in_progress", item_id=item.id))
            effects.append(ListMcpTools(item.id, server))
        finished = [key for key, listing in self._by_key.items() if not listing.running]
        for key in finished[: max(0, len(self._by_key) - self.max_kept)]:
            del self._by_key[key]
        return effects

    def pending(self, tools: list[Tool]) -> set[str]:
        """The listings still running for the servers among ``tools`` (their item ids)."""
        listings = [self._by_key.get(t.key) for t in tools if isinstance(t, McpServer)]
        return {x.item.id for x in listings if x is not None and x.running}

    def listed(self) -> dict[tuple[Any, ...], list[McpTool]]:
        """The tools each server listed, by its key."""
        return {key: listing.tools for key, listing in self._by_key.items() if listing.tools is not None}

    def finished(self, item_id: str, tools: list[McpTool] | None, error: str | None) -> list[Effect]:
        """The runner's listing for ``item_id``: the server's tools, or why listing failed."""
        listing = next((x for x in self._by_key.values() if x.item.id == item_id), None)
        if listing is None:
            return []  # no longer kept
        if tools is None:
            listing.failed = True
            # mcp_list_tools.failed carries no reason: an error event says it.
            message = f"Listing the tools of MCP server '{listing.server.server_label}' failed: {error}"
            error_body = error_event("mcp_list_tools_failed", message, error_type="server_error")["error"]
            return [*self._conversation.done(listing.item), *self._event("mcp_list_tools.failed", item_id=item_id),
                    *self._event("error", error=error_body)]
        listing.tools = tools
        listing.item.data["tools"] = [t.wire() for t in tools]
        self._conversation.recount(listing.item)
        return [*self._conversation.done(listing.item), *self._event("mcp_list_tools.completed", item_id=item_id),
                *self._conversation.make_room(keep=listing.item)]
