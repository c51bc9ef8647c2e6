"""The clinic example: an MCP booking system, dynamic instructions, a typed answer."""
