"""The demo's warm-up hands RL a policy with a learning signal, whatever seed and learning rate it meets.

Issue 28: on an AMD EPYC the mixed phase took the first-turn tool-call rate from 100% to 0% in two steps,
the held-out success before RL was 0%, and RL never found a group of episodes with unequal rewards. Where
a mixed step lands depends on which demonstrations it draws, its learning rate and the CPU's rounding.
This runs the demo config's warm-up (its band, mixed-phase learning rate and direct-answer fraction, read
from ``demo.yaml``) on a shortened task (1-digit operands, 1000 demonstrations: the first phase learns to
copy sooner than on the full task), trains the first phase once, and then runs the mixed phase from
there with three seeds (which demonstrations each step draws), one at the demo's learning rate, one at a
quarter of it and one at ten times it (the first phase's 2e-3, which took the rate from 100% to 4-8% in
one unchecked step). Each must end inside the demo's band, with a held-out success before RL at which
groups of 8 episodes mostly differ. Model seeds and CPU kernel families are what
``benchmarks/demo_seeds.py`` varies, on the full config.
"""

import asyncio
import copy
from dataclasses import replace

import pytest

import forge_env
from agents.sft import demonstration_samples
from agents.train.commands import DEMO_CONFIG
from agents.train.config import load_grpo_config
from agents.train.evaluation import eval_seeds, evaluate
from agents.train.tool_gate import ToolRateProbe, gated_mixed_phase, restore, snapshot
from agents.train.warmup import PROBE_PROMPTS, expert_demonstrations, mixed_samples, run_warmup
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import load_model_and_tokenizer
from forge_env.rl.trainer import TorchTrainer

pytestmark = pytest.mark.slow

SHORT = ["env.kwargs.digits=1", "sft.num_demonstrations=1000"]
EVAL_TASKS = 64
#: Held-out success before RL that leaves groups of 8 a learning signal: at p = 0.03 a group has unequal
#: rewards with probability 1 - 0.97^8 - 0.03^8 = 22%, at 0.1 57%; far above 0.8 most groups are all right.
SUCCESS_BAND = (0.03, 0.8)


async def _success_before_rl(trainer, tokenizer, renderer, config) -> float:
    generator = HFGenerator(copy.deepcopy(trainer.model).eval(), tokenizer, HFGeneratorConfig(max_batch_size=64))
    env_kwargs = {**config.env.kwargs, **config.eval.env_kwargs}
    try:
        result = await evaluate(lambda: forge_env.make(config.env.id, **env_kwargs), generator, renderer,
                                seeds=eval_seeds(config.eval.seed_start, EVAL_TASKS),
                                sampling=SamplingParams(temperature=config.eval.temperature,
                                                        max_tokens=config.rollout.sampling.max_tokens, seed=0))
    finally:
        await generator.aclose()
    return result.success_rate


def _first_phase(seed: int, *, steps: int | None = None):
    """The shortened demo's first phase (plain demonstrations to the target loss) for model and loop ``seed``."""
    config = load_grpo_config(DEMO_CONFIG, [*SHORT, f"model.seed={seed}", f"loop.seed={seed}"])
    sft = config.sft if steps is None else replace(config.sft, steps=steps)
    model, tokenizer = load_model_and_tokenizer(config.model.path, seed=config.model.seed)
    renderer = ChatRenderer(tokenizer)
    # The warm-up's trainer as agents.train.loop builds it.
    trainer = TorchTrainer(model, config.trainer.config, loss="sft", lr=sft.lr, temperature=1.0, loss_kwargs={},
                           lr_schedule=sft.lr_schedule)
    demos = asyncio.run(expert_demonstrations(config.env.id, config.env.kwargs, sft))
    plain = demonstration_samples(demos, renderer)
    history = run_warmup(trainer, plain, sft, seed=config.loop.seed)
    return config, trainer, tokenizer, renderer, demos, plain, history


#: Steps the shortened first phase may take. Model seed 1 took 756 with transformers' init std of 0.02
#: and 193 with the tiny model's 0.05 (this Xeon, AVX-512); the limit leaves room for another CPU's rounding.
FIRST_PHASE_LIMIT = 400


def test_the_first_phase_gets_past_the_copy_plateau_in_a_few_hundred_steps():
    """The first phase's length decided whether the demo fit in 10 minutes (issue 28): with transformers'
    init std of 0.02 the tiny model sat on its copy plateau (loss ~0.25: it had learned the call's template
    but not to copy digits) for 337-1236 steps of the full task depending on the seed, 0.4-0.5 s each
    without vector kernels. Model seed 1 was the slowest of five there; its shortened first phase must reach
    the target loss within ``FIRST_PHASE_LIMIT`` steps."""
    config, *_, history = _first_phase(1, steps=FIRST_PHASE_LIMIT)
    assert len(history) < FIRST_PHASE_LIMIT, (
        f"model seed 1 did not reach the target loss {config.sft.target_loss} in {FIRST_PHASE_LIMIT} steps "
        f"(last loss {history[-1]['loss']:.3f}): the copy plateau is back")


@pytest.fixture(scope="module")
def after_phase_one():
    """The shortened demo's first phase, trained once (model seed 0)."""
    config, trainer, tokenizer, renderer, demos, plain, history = _first_phase(0)
    sft = config.sft
    assert len(history) < sft.steps, "the first phase reaches its target loss"
    probe = ToolRateProbe(plain[:PROBE_PROMPTS], pad_token_id=trainer.pad_token_id)
    assert probe.rate(trainer.model) > 0.9, "the first phase teaches the model to open with the calculator"
    return config, trainer, tokenizer, renderer, mixed_samples(demos, plain, sft, renderer), probe, snapshot(trainer)


@pytest.mark.parametrize(("seed", "lr_factor"), [(0, 1.0), (1, 0.25), (2, 10.0)])
async def test_the_demo_warm_up_ends_inside_the_band_at_any_seed_and_mixed_lr(after_phase_one, seed, lr_factor):
    config, trainer, tokenizer, renderer, mixed, probe, saved = after_phase_one
    sft = config.sft
    assert sft.min_tool_rate is not None and sft.target_tool_rate is not None and sft.direct_answer_lr
    restore(trainer, saved)
    lr = sft.direct_answer_lr * lr_factor
    gate = gated_mixed_phase(trainer, mixed, probe, replace(sft, direct_answer_lr=lr), seed=seed)
    assert sft.min_tool_rate <= gate.rate <= sft.target_tool_rate, gate
    success = await _success_before_rl(trainer, tokenizer, renderer, config)
    assert SUCCESS_BAND[0] <= success <= SUCCESS_BAND[1], (gate, success)
