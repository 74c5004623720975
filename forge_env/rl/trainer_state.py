"""A trainer's resumable state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint is shared like any other file, and unpickling one runs whatever code it names. So
the optimizer's tensors and the torch RNG states go to ``trainer_state.safetensors``, and the
rest (step, optimizer hyper-parameters, LR schedule, Python and NumPy RNG states, the config
for reference) to ``trainer_state.json``. Loading reads only data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

TENSORS_FILE = "trainer_state.safetensors"
PLAIN_FILE = "trainer_state.json"
_FORMAT = 1


class TrainerStateError(ValueError):
    """A trainer state on disk is missing, from an unknown format, or does not fit this trainer."""


def save_trainer_state(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any, step: int,
                       config: dict[str, Any]) -> None:
    """Write the two files under ``path`` (see the module docstring)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    optimizer_state = optimizer.state_dict()
    plain_state: dict[str, dict[str, Any]] = {}
    for param_id, values in optimizer_state["state"].items():
        plain_state[str(param_id)] = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{param_id}/{name}"] = value.detach().cpu().contiguous()
            else:
                plain_state[str(param_id)][name] = value
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{index}"] = cuda_state.cpu()
    version, internal, gauss = random.getstate()
    bit_generator, keys, position, has_gauss, cached = np.random.get_state()
    plain = {
        "format": _FORMAT,
        "step": int(step),
        "optimizer": {"param_groups": optimizer_state["param_groups"], "state": plain_state},
        "scheduler": scheduler.state_dict(),
        "rng": {"python": [version, list(internal), gauss],
                "numpy": [bit_generator, [int(k) for k in keys], int(position), int(has_gauss), float(cached)]},
        "config": config,
    }
    save_file(tensors, str(path / TENSORS_FILE))
    (path / PLAIN_FILE).write_text(json.dumps(plain, default=str))


def has_trainer_state(path: Path) -> bool:
    return (path / TENSORS_FILE).exists() and (path / PLAIN_FILE).exists()


def load_trainer_state(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any, device: torch.device) -> int:
    """Restore optimizer, schedule and RNG states written by :func:`save_trainer_state`; return the step."""
    from safetensors.torch import load_file

    try:
        plain = json.loads((path / PLAIN_FILE).read_text())
        if plain.get("format") != _FORMAT:
            raise TrainerStateError(f"{path / PLAIN_FILE}: unknown trainer state format {plain.get('format')!r}")
        tensors = load_file(str(path / TENSORS_FILE), device="cpu")
        state: dict[int, dict[str, Any]] = {}
        for param_id, values in plain["optimizer"]["state"].items():
            state[int(param_id)] = dict(values)
        for key, tensor in tensors.items():
            kind, *rest = key.split("/")
            if kind == "optimizer":
                param_id, name = rest
                state.setdefault(int(param_id), {})[name] = tensor.to(device) if tensor.dim() else tensor
        optimizer.load_state_dict({"state": state, "param_groups": plain["optimizer"]["param_groups"]})
        scheduler.load_state_dict(plain["scheduler"])
        version, internal, gauss = plain["rng"]["python"]
        bit_generator, keys, position, has_gauss, cached = plain["rng"]["numpy"]
        step = int(plain["step"])
    except TrainerStateError:
        raise
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise TrainerStateError(f"{path}: not a readable trainer state ({type(exc).__name__}: {exc})") from None
    torch.set_rng_state(tensors["rng/torch"])
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state((bit_generator, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    cuda_states = [tensors[f"rng/cuda/{i}"] for i in range(len(tensors)) if f"rng/cuda/{i}" in tensors]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    return step
