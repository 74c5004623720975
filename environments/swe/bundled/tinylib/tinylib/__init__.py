"""tinylib: small helpers used by forge-env SWE-v0 tasks."""
