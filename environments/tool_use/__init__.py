"""ToolUse-v0: multi-hop questions over a synthetic knowledge base, answered with search, read and a calculator."""
