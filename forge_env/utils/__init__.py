"""Small shared helpers (async bridging, JSON checks)."""
