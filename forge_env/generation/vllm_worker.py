"""A vLLM worker extension that loads new weights into the running model (used by ``VLLMGenerator``).

vLLM runs its model in worker processes; ``collective_rpc("forge_load_weights", args=(source,))`` reaches
this method on every worker. ``source`` is a state dict (name -> tensor, HF parameter names) or the path of
a safetensors file or directory (the cheap hand-off: the trainer writes to /dev/shm, workers mmap it).
This module is imported by vLLM inside its workers; nothing else imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class ForgeWorkerExtension:
    """Mixed into vLLM's GPU worker through ``worker_extension_cls``."""

    def forge_load_weights(self, source: Mapping[str, Any] | str) -> int:
        """Load ``source`` into the model in place; return how many tensors were loaded."""
        count = 0

        def counted(items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in items:
                count += 1
                yield item

        self.model_runner.model.load_weights(weights=counted(_weights(source)))  # type: ignore[attr-defined]
        return count


def _weights(source: Mapping[str, Any] | str) -> Iterator[tuple[str, Any]]:
    if isinstance(source, Mapping):
        yield from source.items()
        return
    from safetensors.torch import safe_open

    path = Path(source)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .safetensors files under {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
