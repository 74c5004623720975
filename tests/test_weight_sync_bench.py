"""``benchmarks/weight_sync_bench.py`` says which row is the training loop's default weight hand-off (issue 47,
item 4), read from the loop's own defaults rather than written by hand."""

from __future__ import annotations

import torch

from agents.train.components import WEIGHT_TRANSPORTS
from agents.train.config import GRPOConfig
from benchmarks import weight_sync_bench


def test_the_loop_default_row_is_the_ring_with_its_checksum():
    assert GRPOConfig().generator.resolved_weight_transport() == "ring"
    assert WEIGHT_TRANSPORTS["ring"][0] == "ring"
    assert weight_sync_bench.loop_default_row() == "ring load_shared (checksum)"


def test_the_table_marks_exactly_that_row(capsys):
    torch.set_grad_enabled(False)
    try:
        weight_sync_bench.bench_model("tiny", weight_sync_bench.tiny_model, repeats=1)
    finally:
        torch.set_grad_enabled(True)
    marked = [line for line in capsys.readouterr().out.splitlines() if weight_sync_bench.DEFAULT_MARK in line]
    assert len(marked) == 1 and marked[0].split()[:3] == ["ring", "load_shared", "(checksum)"]
