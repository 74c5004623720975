"""The SFT warm-up: expert demonstrations, direct-answer rewrites, and training with an early stop."""

import pytest

import forge_env
from agents.sft import demonstration_samples
from agents.train.config import SFTConfig
from agents.train.warmup import collect_demonstrations, direct_answer, run_warmup
from forge_env.chat import ChatRenderer
from forge_env.models import build_byte_tokenizer, build_tiny_model
from forge_env.rl.trainer import TorchTrainer, TrainerConfig

ARITHMETIC = {"num_operands": 2, "digits": 1, "operators": "+", "system_prompt": None}


async def test_demonstrations_come_from_the_expert_and_some_answer_directly():
    config = SFTConfig(enabled=True, num_demonstrations=40, direct_answer_fraction=0.5)
    demos = await collect_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC, config)
    assert len(demos) == 40
    direct = [d for d in demos if len(d["messages"]) == 2]
    with_tool = [d for d in demos if len(d["messages"]) == 4]
    assert len(direct) + len(with_tool) == 40 and 8 < len(direct) < 32
    for demo in direct:
        assert demo["messages"][0]["role"] == "user"
        assert demo["messages"][1] == {"role": "assistant", "content": demo["task"]["answer"]}
    for demo in with_tool:
        assert demo["messages"][1]["tool_calls"][0]["function"]["name"] == "calculator"
        assert demo["messages"][-1]["content"] == demo["task"]["answer"]
    again = await collect_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC, config)
    assert again == demos  # seeded: the same seeds give the same demonstrations and rewrites


def test_direct_answer_needs_a_final_answer():
    demo = {"messages": [{"role": "user", "content": "What is 1+1?"},
                         {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                          "function": {"name": "calculator", "arguments": "{}"}}]}]}
    with pytest.raises(ValueError, match="final answer"):
        direct_answer(demo)


async def test_an_environment_without_an_expert_cannot_make_demonstrations():
    forge_env.register("tests/GuessWarmup-v0", "tests.guess_env:GuessEnv")
    with pytest.raises(ValueError, match="has no expert_action"):
        await collect_demonstrations("tests/GuessWarmup-v0", {}, SFTConfig(enabled=True, num_demonstrations=2))


async def test_warmup_trains_and_stops_early_at_the_target_loss():
    demos = await collect_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC,
                                         SFTConfig(enabled=True, num_demonstrations=8))
    samples = demonstration_samples(demos, ChatRenderer(build_byte_tokenizer()))
    trainer = TorchTrainer(build_tiny_model(0), TrainerConfig(loss="sft", lr=1e-3, device="cpu"))
    full = run_warmup(trainer, samples, SFTConfig(enabled=True, steps=5, batch_size=2))
    assert len(full) == 5 and full[-1]["loss"] < full[0]["loss"]
    # A target every running mean meets: training stops after the 50 steps of history it waits for.
    stopped = run_warmup(trainer, samples, SFTConfig(enabled=True, steps=80, batch_size=1, target_loss=100.0))
    assert len(stopped) == 51


async def test_first_token_direct_answers_train_only_the_choice_to_answer():
    config = SFTConfig(enabled=True, num_demonstrations=20, direct_answer_fraction=1.0, direct_answer_loss="first_token")
    demos = await collect_demonstrations("forge_env/Arithmetic-v0", {**ARITHMETIC, "digits": 2}, config)
    assert all(d["messages"][-1]["train_prefix_tokens"] == 1 for d in demos)
    renderer = ChatRenderer(build_byte_tokenizer())
    full = demonstration_samples([direct_answer(d) for d in demos], renderer)
    first = demonstration_samples(demos, renderer)
    for whole, prefix in zip(full, first, strict=True):
        assert whole.token_ids == prefix.token_ids
        assert sum(prefix.loss_mask) == 1 and sum(whole.loss_mask) > 1
        # The one trained position is the first one the full answer trains.
        assert prefix.loss_mask.index(1) == whole.loss_mask.index(1)


def test_train_prefix_tokens_must_be_a_positive_int():
    demo = {"messages": [{"role": "user", "content": "What is 1+1?"},
                         {"role": "assistant", "content": "2", "train_prefix_tokens": 0}]}
    with pytest.raises(ValueError, match="train_prefix_tokens"):
        demonstration_samples([demo], ChatRenderer(build_byte_tokenizer()))


def test_direct_answer_loss_is_validated():
    with pytest.raises(ValueError, match="direct_answer_loss"):
        SFTConfig(direct_answer_loss="last_token")


async def test_direct_answer_steps_add_a_final_phase_on_the_mix(capsys):
    from agents.train.warmup import warm_up

    renderer = ChatRenderer(build_byte_tokenizer())
    trainer = TorchTrainer(build_tiny_model(0), TrainerConfig(loss="sft", lr=1e-3, device="cpu"))
    config = SFTConfig(enabled=True, steps=3, batch_size=2, num_demonstrations=6, direct_answer_fraction=0.5,
                       direct_answer_loss="first_token", direct_answer_steps=2)
    result = await warm_up(trainer, renderer, "forge_env/Arithmetic-v0", ARITHMETIC, config)
    assert len(result.history) == 5 and result.gate is None
    assert "2 more steps with 50% of the demonstrations answering without tools" in capsys.readouterr().err
    with pytest.raises(ValueError, match="direct_answer_steps"):
        SFTConfig(direct_answer_steps=-1)


async def test_target_tool_rate_ends_the_direct_answer_phase_at_a_measured_rate(capsys):
    import torch

    from agents.train.warmup import ToolRateProbe, expert_demonstrations, warm_up

    renderer = ChatRenderer(build_byte_tokenizer())
    trainer = TorchTrainer(build_tiny_model(0), TrainerConfig(loss="sft", lr=1e-3, device="cpu"))
    config = SFTConfig(enabled=True, steps=2, batch_size=2, num_demonstrations=6, direct_answer_fraction=0.5,
                       direct_answer_loss="first_token", direct_answer_steps=4, target_tool_rate=0.99)
    # The probe's rate is the model's probability of the tool-call token after each first-turn prompt.
    samples = demonstration_samples(await expert_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC, config),
                                    renderer)
    probe = ToolRateProbe(samples, pad_token_id=trainer.pad_token_id)
    first = samples[0].loss_mask.index(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([samples[0].token_ids[:first]])).logits[0, -1]
    expected = [float(logits.softmax(-1)[samples[0].token_ids[first]])]
    for sample in samples[1:]:
        start = sample.loss_mask.index(1)
        with torch.no_grad():
            row = trainer.model(input_ids=torch.tensor([sample.token_ids[:start]])).logits[0, -1]
        expected.append(float(row.softmax(-1)[sample.token_ids[start]]))
    assert probe.rate(trainer.model) == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    # A random model opens with a tool call far less often than 99%: already inside the band 0-99%, the
    # mixed phase takes no step.
    result = await warm_up(trainer, renderer, "forge_env/Arithmetic-v0", ARITHMETIC, config)
    assert len(result.history) == 2 and result.gate is not None and result.gate.steps == 0
    assert result.gate.rate == pytest.approx(probe.rate(trainer.model))
    assert "inside the band 0%-99%, after 0 mixed steps" in capsys.readouterr().err
    with pytest.raises(ValueError, match="target_tool_rate"):
        SFTConfig(target_tool_rate=1.5)


async def test_the_gate_undoes_a_step_that_overshoots_below_the_floor(capsys):
    """At a learning rate that takes the rate from ~100% to ~0% in one step, the gate undoes that step and
    halves the rate until the step lands above the floor: the phase ends inside the band, not below it."""
    import copy

    from agents.train.tool_gate import ToolRateProbe, gated_mixed_phase, scale_lr
    from agents.train.warmup import expert_demonstrations, with_direct_answers

    config = SFTConfig(enabled=True, num_demonstrations=24, batch_size=4, lr=2e-3, direct_answer_fraction=1.0,
                       direct_answer_loss="first_token", direct_answer_steps=20, direct_answer_lr=0.05,
                       target_tool_rate=0.7, min_tool_rate=0.3)
    renderer = ChatRenderer(build_byte_tokenizer())
    demos = await expert_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC, config)
    plain = demonstration_samples(demos, renderer)
    direct = demonstration_samples(with_direct_answers(demos, config), renderer)
    # Enough plain steps that the model opens (nearly) every first turn with the tool call.
    trainer = TorchTrainer(build_tiny_model(0), TrainerConfig(loss="sft", lr=2e-3, device="cpu"))
    run_warmup(trainer, plain, SFTConfig(enabled=True, steps=30, batch_size=4))
    probe = ToolRateProbe(plain, pad_token_id=trainer.pad_token_id)
    assert probe.rate(trainer.model) > 0.8

    # Without the gate: one step at that lr overshoots far below the floor (what the gate must prevent).
    ungated = copy.deepcopy(trainer)
    scale_lr(ungated, 0.05 / 2e-3)
    ungated.train_step(direct[:4])
    assert probe.rate(ungated.model) < 0.3

    step_before = trainer.step
    result = gated_mixed_phase(trainer, direct, probe, config)
    assert result.rate_before > 0.8 and result.backoffs >= 1 and result.lr < 0.05
    assert 0.3 <= result.rate <= 0.7 and result.in_band
    assert result.rate == pytest.approx(probe.rate(trainer.model))  # the model is the accepted step's
    assert trainer.step == step_before + result.steps  # undone steps left no trace in the optimizer's count
    err = capsys.readouterr().err
    assert "below the floor 30%: undone, retried at lr 0.025" in err
    assert "inside the band 30%-70%" in err


async def test_the_gate_stops_at_once_inside_the_band_and_warns_when_it_cannot_get_there(capsys):
    from agents.train.tool_gate import ToolRateProbe, gated_mixed_phase
    from agents.train.warmup import expert_demonstrations

    config = SFTConfig(enabled=True, num_demonstrations=8, batch_size=4, lr=2e-3, direct_answer_steps=3,
                       target_tool_rate=0.5, min_tool_rate=0.1, direct_answer_lr=1e-3)
    renderer = ChatRenderer(build_byte_tokenizer())
    plain = demonstration_samples(await expert_demonstrations("forge_env/Arithmetic-v0", ARITHMETIC, config),
                                  renderer)
    trainer = TorchTrainer(build_tiny_model(0), TrainerConfig(loss="sft", lr=2e-3, device="cpu"))
    probe = ToolRateProbe(plain, pad_token_id=trainer.pad_token_id)
    rates = iter([0.3])
    inside = gated_mixed_phase(trainer, plain, probe, config, rate=lambda model: next(rates))
    assert inside.steps == 0 and inside.in_band and trainer.step == 0
    # Plain demonstrations only raise the rate: three steps cannot reach the band; the phase says so.
    rates = iter([0.9, 0.95, 0.97, 0.99])
    above = gated_mixed_phase(trainer, plain, probe, config, rate=lambda model: next(rates))
    assert above.steps == 3 and not above.in_band and above.rate == 0.99
    assert "WARNING: tool-call rate at the first turn 99.0%, not inside the band 10%-50%" in capsys.readouterr().err


def test_the_band_is_validated():
    with pytest.raises(ValueError, match="set both"):
        SFTConfig(min_tool_rate=0.2)
    with pytest.raises(ValueError, match="min_tool_rate must be in"):
        SFTConfig(min_tool_rate=0.5, target_tool_rate=0.4)
    with pytest.raises(ValueError, match="direct_answer_lr must be > 0"):
        SFTConfig(direct_answer_lr=0.0)
