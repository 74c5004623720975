"""Arithmetic-v0: seeded arithmetic tasks solved with a calculator tool (for tiny models and demos)."""
