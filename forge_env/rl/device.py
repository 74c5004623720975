"""Device and precision choices shared by the trainer and the reference model.

``"auto"`` means one CUDA GPU when there is one, else the CPU; mixed precision means
fp32 master weights with bf16 autocast (``"auto"``: bf16 on GPU, fp32 on CPU).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Literal

import torch

Precision = Literal["auto", "fp32", "bf16"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> ``cuda`` if available else ``cpu``; anything else is passed to ``torch.device``."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} was requested but CUDA is not available; use device='cpu' or 'auto'")
    return resolved


def resolve_precision(precision: Precision, device: torch.device) -> Literal["fp32", "bf16"]:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; choose 'auto', 'fp32' or 'bf16'")
    return precision


def autocast(device: torch.device, precision: Literal["fp32", "bf16"]) -> AbstractContextManager:
    """A bf16 autocast context on ``device``, or a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()
