"""``osfleet mcp serve``: a fleet's desktop as Model Context Protocol tools (``server``), one leased desktop per
MCP session (``desk``), over stdio or authenticated streamable HTTP (``http``). Needs the ``mcp`` extra."""
