"""What machine a figure was measured on: printed by the demo and the benchmarks next to their numbers.

Results of a tiny model trained on a CPU depend on that CPU (its vector instructions change the
rounding of every matmul), so a figure without its machine cannot be checked.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine() -> str:
    """``"<cpu model>, N cores, torch <kernel ISA>"``: enough to tell two machines' figures apart."""
    try:
        import torch

        isa = f", torch kernels {torch.backends.cpu.get_cpu_capability()}"
    except Exception:  # torch missing or too old to say
        isa = ""
    return f"{cpu_model()}, {os.cpu_count()} cores{isa}"
