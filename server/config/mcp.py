"""``mcp``: the Model Context Protocol server at ``/mcp`` (``docs/mcp.md``)."""

from __future__ import annotations

from pydantic import Field

from server.config.base import Section


class McpSettings(Section):
    enabled: bool = Field(True, description="Serve MCP tools (memory search, events, sources, faces, ask) at /mcp "
                          "on the HTTP port (streamable HTTP), behind auth.token when one is set.")
    ask_entries: int = Field(8, ge=1, le=50, description="Memory entries the `ask` tool puts before the LLM.")
    ask_context_tokens: int = Field(600, ge=50, description="At most about this many tokens of those entries.")
    ask_answer_tokens: int = Field(200, ge=16, le=4096, description="Longest answer of the `ask` tool, in tokens.")
