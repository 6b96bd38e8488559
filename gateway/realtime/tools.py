"""The tools a session offers its model: function tools (the client runs them) and MCP servers (the gateway
runs their tools itself, see gateway/runtime/mcp_client.py).

``parse_tools`` and ``parse_tool_choice`` read and check the ``tools`` and ``tool_choice`` of session.update
and response.create; ``llm_tools`` turns them, with the tools each MCP server listed, into the
chat-completions ``tools`` and ``tool_choice`` the LLM gets, and says which tool each name the LLM may call
stands for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gateway.core.values import field_of
from gateway.realtime.events import Dialect, ProtocolError

# Function names as chat-completions servers accept them (OpenAI's rule; vLLM passes them to the template).
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")  # an HTTP field name (RFC 9110 token)
MAX_TOOLS = 128  # entries of one tools[] (OpenAI's chat-completions limit)
# Headers the connection itself sets: a client's would send the request to another site behind the same
# address (Host) or break its framing.
CONNECTION_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
                                "te", "trailer", "expect", "proxy-authorization", "proxy-connection",
                                "mcp-session-id", "mcp-protocol-version"})
CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters}


@dataclass(frozen=True)
class ToolFilter:
    """A filter on an MCP server's tools: by name, by the server's read-only hint, or both (empty: every tool)."""

    tool_names: tuple[str, ...] | None = None
    read_only: bool | None = None

    def matches(self, tool: McpTool) -> bool:
        if self.tool_names is not None and tool.name not in self.tool_names:
            return False
        return self.read_only is None or tool.read_only == self.read_only

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tool_names is not None:
            out["tool_names"] = list(self.tool_names)
        if self.read_only is not None:
            out["read_only"] = self.read_only
        return out


@dataclass(frozen=True)
class McpServer:
    """A ``type: "mcp"`` tool: an MCP server the gateway connects to for the client."""

    server_label: str
    server_url: str
    allowed_tools: ToolFilter | None = None
    headers: tuple[tuple[str, str], ...] = ()  # authorization included, as a Bearer header
    # "always", "never", or (always filter, never filter)
    require_approval: str | tuple[ToolFilter | None, ToolFilter | None] = "always"
    server_description: str | None = None
    sent: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # reported back, secrets left out

    def allows(self, tool: McpTool) -> bool:
        return self.allowed_tools is None or self.allowed_tools.matches(tool)

    def needs_approval(self, tool: McpTool) -> bool:
        """OpenAI's default: every call is approved by the client unless a ``never`` filter exempts it."""
        policy = self.require_approval
        if isinstance(policy, str):
            return policy == "always"
        always, never = policy
        if always is not None and always.matches(tool):
            return True
        return never is None or not never.matches(tool)

    @property
    def key(self) -> tuple[Any, ...]:
        """What a listing depends on: the same key, the same tools (server, credentials, the tools allowed)."""
        return self.server_label, self.server_url, self.headers, self.allowed_tools

    def wire(self) -> dict[str, Any]:
        return self.sent


@dataclass(frozen=True)
class McpTool:
    """A tool an MCP server listed."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    annotations: dict[str, Any] | None = None

    @property
    def read_only(self) -> bool:
        return bool((self.annotations or {}).get("readOnlyHint"))

    def wire(self) -> dict[str, Any]:
        # The JS Agents SDK requires a description string.
        out = {"name": self.name, "input_schema": self.input_schema, "description": self.description or ""}
        if self.annotations is not None:
            out["annotations"] = self.annotations
        return out


Tool = FunctionTool | McpServer


@dataclass(frozen=True)
class McpRoute:
    """What a name the LLM calls stands for when it is an MCP server's tool."""

    server: McpServer
    tool: McpTool


class McpPolicy:
    """Which MCP servers clients may name (the [mcp] section): see ``check_url``."""

    def __init__(self, enabled: bool = True, allowed_hosts: str = "", max_servers: int = 8) -> None:
        self.enabled = enabled
        self.max_servers = max_servers
        self.allowed_hosts = tuple(h.strip().lower() for h in allowed_hosts.split(",") if h.strip())

    def host_listed(self, host: str) -> bool:
        """Whether ``allowed_hosts`` names ``host`` (an entry "*.example.com" names its subdomains)."""
        host = host.lower()
        return any(host == h or (h.startswith("*.") and host.endswith(h[1:])) for h in self.allowed_hosts)

    def check_url(self, url: str, param: str) -> None:
        """The URL's form and host, as far as they can be checked without resolving it (the MCP client checks
        the addresses it resolves to: gateway/runtime/mcp_client.py)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProtocolError("invalid_value", f"'{param}' must be an http:// or https:// URL.", param)
        if parts.username or parts.password:
            raise ProtocolError("invalid_value", f"'{param}' must not carry credentials; use 'headers' or "
                                "'authorization'.", param)
        if self.allowed_hosts and not self.host_listed(parts.hostname):
            raise ProtocolError("mcp_host_not_allowed", f"MCP server host '{parts.hostname}' is not allowed on "
                                "this gateway ([mcp] allowed_hosts).", param)


def _filter(value: Any, param: str) -> ToolFilter:
    if isinstance(value, list):
        names = value
        read_only = None
    else:
        f = field_of({"f": value}, "f", dict, param, required=True)
        names = field_of(f, "tool_names", list, f"{param}.tool_names")
        read_only = field_of(f, "read_only", bool, f"{param}.read_only")
    if names is not None:
        for i, name in enumerate(names):
            field_of({"n": name}, "n", str, f"{param}[{i}]" if isinstance(value, list)
                     else f"{param}.tool_names[{i}]", required=True)
    return ToolFilter(tuple(names) if names is not None else None, read_only)


def _function(t: dict[str, Any], param: str) -> FunctionTool:
    name = field_of(t, "name", str, f"{param}.name", required=True)
    if not NAME.match(name):
        raise ProtocolError("invalid_value", f"Invalid '{param}.name': {name!r}; a function name is 1-64 letters, "
                            "digits, '_' or '-'.", f"{param}.name")
    parameters = field_of(t, "parameters", dict, f"{param}.parameters")
    if parameters is not None and parameters.get("type", "object") != "object":
        raise ProtocolError("invalid_value", f"'{param}.parameters' must be a JSON schema of type 'object'.",
                            f"{param}.parameters")
    return FunctionTool(name, field_of(t, "description", str, f"{param}.description"), parameters)


def _mcp(t: dict[str, Any], param: str, dialect: Dialect, policy: McpPolicy) -> McpServer:
    if dialect is Dialect.BETA:
        raise ProtocolError("invalid_value", "MCP tools are part of the GA interface; connect without the "
                            "'OpenAI-Beta: realtime=v1' header to use them.", f"{param}.type")
    if not policy.enabled:
        raise ProtocolError("mcp_disabled", "MCP tools are disabled on this gateway ([mcp] enabled).",
                            f"{param}.type")
    label = field_of(t, "server_label", str, f"{param}.server_label", required=True)
    if not NAME.match(label):
        raise ProtocolError("invalid_value", f"Invalid '{param}.server_label': {label!r}; a label is 1-64 letters, "
                            "digits, '_' or '-'.", f"{param}.server_label")
    for key in ("connector_id", "tunnel_id"):
        if t.get(key) is not None:
            raise ProtocolError("unsupported_value", f"'{param}.{key}' is not supported by this gateway; give "
                                "'server_url'.", f"{param}.{key}")
    url = field_of(t, "server_url", str, f"{param}.server_url", required=True)
    policy.check_url(url, f"{param}.server_url")
    headers: dict[str, str] = {}
    for key, value in (field_of(t, "headers", dict, f"{param}.headers") or {}).items():
        value = field_of({"v": value}, "v", str, f"{param}.headers.{key}", required=True)
        if not HEADER.match(key) or "\r" in value or "\n" in value:
            raise ProtocolError("invalid_value", f"'{param}.headers' has a header that HTTP cannot carry: "
                                f"{key!r}.", f"{param}.headers.{key}")
        if key.lower() in CONNECTION_HEADERS:
            raise ProtocolError("invalid_value", f"'{param}.headers' may not set {key!r}: the connection sets it.",
                                f"{param}.headers.{key}")
        headers[key] = value
    if (token := field_of(t, "authorization", str, f"{param}.authorization")) is not None:
        headers["Authorization"] = f"Bearer {token}"
    allowed = None if t.get("allowed_tools") is None else _filter(t["allowed_tools"], f"{param}.allowed_tools")
    approval: str | tuple[ToolFilter | None, ToolFilter | None] = "always"
    raw = t.get("require_approval")
    if isinstance(raw, str):
        if raw not in ("always", "never"):
            raise ProtocolError("invalid_value", f"Invalid value for '{param}.require_approval': {raw!r}; "
                                "supported: always, never, or a filter object.", f"{param}.require_approval")
        approval = raw
    elif raw is not None:
        r = field_of(t, "require_approval", dict, f"{param}.require_approval")
        approval = tuple(None if r.get(k) is None else _filter(r[k], f"{param}.require_approval.{k}")
                         for k in ("always", "never"))  # type: ignore[assignment]
    description = field_of(t, "server_description", str, f"{param}.server_description")
    # Reported back in session.updated as checked, headers and authorization left out (they are secrets).
    sent: dict[str, Any] = {"type": "mcp", "server_label": label, "server_url": url,
                            "server_description": description}
    if allowed is not None:
        sent["allowed_tools"] = list(t["allowed_tools"]) if isinstance(t["allowed_tools"], list) else allowed.wire()
    if isinstance(approval, str):
        sent["require_approval"] = approval
    else:
        sent["require_approval"] = {k: f.wire() for k, f in zip(("always", "never"), approval, strict=True) if f}
    return McpServer(label, url, allowed, tuple(sorted(headers.items())), approval, description, sent)


def parse_tools(value: Any, param: str, dialect: Dialect, policy: McpPolicy) -> list[Tool]:
    """A ``tools`` array, checked: function tools by name and schema, MCP servers by label and URL."""
    entries = field_of({"t": value}, "t", list, param, required=True)
    if len(entries) > MAX_TOOLS:
        raise ProtocolError("invalid_value", f"'{param}' may hold at most {MAX_TOOLS} tools.", param)
    tools: list[Tool] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        p = f"{param}[{i}]"
        t = field_of({"t": entry}, "t", dict, p, required=True)
        kind = field_of(t, "type", str, f"{p}.type", required=True)
        if kind == "function":
            tool: Tool = _function(t, p)
            key, what = tool.name, "function"
        elif kind == "mcp":
            tool = _mcp(t, p, dialect, policy)
            key, what = "mcp:" + tool.server_label, "server_label"
            if sum(isinstance(x, McpServer) for x in tools) >= policy.max_servers:
                raise ProtocolError("invalid_value", f"'{param}' may name at most {policy.max_servers} MCP servers "
                                    "([mcp] max_servers).", p)
        else:
            raise ProtocolError("invalid_value", f"Invalid value for '{p}.type': {kind!r}; supported: function, "
                                "mcp.", f"{p}.type")
        if key in names:
            raise ProtocolError("invalid_value", f"'{param}' has two tools with the same {what} "
                                f"'{key.removeprefix('mcp:')}'.", p)
        names.add(key)
        tools.append(tool)
    return tools


def parse_tool_choice(value: Any, tools: list[Tool], param: str, dialect: Dialect) -> str | dict[str, Any]:
    """A ``tool_choice``: auto, none, required, a named function ({"type": "function", "name"}, or in beta the
    bare name) or an MCP server ({"type": "mcp", "server_label", "name"?}), checked against ``tools``."""
    choice = field_of({"c": value}, "c", (str, dict), param, required=True)
    functions = {t.name for t in tools if isinstance(t, FunctionTool)}
    if isinstance(choice, str):
        if choice in CHOICES:
            return choice
        if dialect is Dialect.BETA and choice in functions:
            return {"type": "function", "name": choice}
        raise ProtocolError("invalid_value", f"Invalid value for '{param}': {choice!r}; supported: auto, none, "
                            "required, or a tool.", param)
    kind = field_of(choice, "type", str, f"{param}.type", required=True)
    if kind == "function":
        name = field_of(choice, "name", str, f"{param}.name", required=True)
        if name not in functions:
            raise ProtocolError("invalid_value", f"'{param}.name' names function '{name}', which is not among the "
                                "tools.", f"{param}.name")
        return {"type": "function", "name": name}
    if kind == "mcp" and dialect is Dialect.GA:
        label = field_of(choice, "server_label", str, f"{param}.server_label", required=True)
        if not any(isinstance(t, McpServer) and t.server_label == label for t in tools):
            raise ProtocolError("invalid_value", f"'{param}.server_label' names MCP server '{label}', which is not "
                                "among the tools.", f"{param}.server_label")
        out: dict[str, Any] = {"type": "mcp", "server_label": label}
        if (name := field_of(choice, "name", str, f"{param}.name")) is not None:
            out["name"] = name
        return out
    supported = "function, mcp" if dialect is Dialect.GA else "function"
    raise ProtocolError("invalid_value", f"Invalid value for '{param}.type': {kind!r}; supported: {supported}.",
                        f"{param}.type")


@dataclass(frozen=True)
class LlmTools:
    """The tools as the LLM gets them, and what each name it may call stands for."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # chat-completions tools
    tool_choice: str | dict[str, Any] | None = None  # None: not sent (no tools)
    mcp: dict[str, McpRoute] = field(default_factory=dict)  # LLM name -> MCP server and tool


def llm_tools(tools: list[Tool], choice: str | dict[str, Any],
              listed: dict[tuple[Any, ...], list[McpTool]]) -> LlmTools:
    """Chat-completions tools from ``tools``, an MCP server's entry standing for the tools it ``listed`` (by
    its ``key``) that it allows. An MCP tool is not offered whose name an earlier tool took, or one the LLM's
    server would refuse (not a function name, or past MAX_TOOLS); a tool_choice naming an MCP server
    offers that server's tools only."""
    if isinstance(choice, dict) and choice["type"] == "mcp":
        tools = [t for t in tools if isinstance(t, McpServer) and t.server_label == choice["server_label"]]
    chat: list[dict[str, Any]] = []
    mcp: dict[str, McpRoute] = {}
    taken = {t.name for t in tools if isinstance(t, FunctionTool)}
    for t in tools:
        if isinstance(t, FunctionTool):
            function = {"name": t.name, "parameters": t.parameters or {"type": "object", "properties": {}}}
            if t.description:
                function["description"] = t.description
            chat.append({"type": "function", "function": function})
            continue
        for tool in listed.get(t.key, []):
            if not t.allows(tool) or tool.name in taken or not NAME.match(tool.name) or len(chat) >= MAX_TOOLS:
                continue
            taken.add(tool.name)
            mcp[tool.name] = McpRoute(t, tool)
            function = {"name": tool.name, "parameters": tool.input_schema}
            if tool.description:
                function["description"] = tool.description
            chat.append({"type": "function", "function": function})
    if not chat:
        return LlmTools(chat, None, mcp)
    tool_choice: str | dict[str, Any]
    if isinstance(choice, str):
        tool_choice = choice
    elif choice["type"] == "function":
        tool_choice = {"type": "function", "function": {"name": choice["name"]}}
    elif (name := choice.get("name")) is not None and name in mcp:
        tool_choice = {"type": "function", "function": {"name": name}}
    else:  # an MCP server without a tool named: one of its tools is required, as near as chat completions get
        tool_choice = "required"
    return LlmTools(chat, tool_choice, mcp)
