"""``forge-env eval``: evaluate a model (in-process, a token-level server, or a chat API) on an environment.

``runner`` plays the planned episodes (same seeds, same tasks for every model) into ``episodes.jsonl``,
``metrics`` turns them into ``summary.json`` and the printed tables, ``commands`` is the CLI.
"""
