"""LoRA (``trainer.lora``) on the tiny model: the config, TorchTrainer training and pushing the adapter
alone, HFGenerator serving base + adapter like the merged model, adapter-only checkpoints, TitanTrainer's
refusal, and the GRPO app with LoRA (a few RL steps move the adapter, not the base)."""

import pytest
import torch

from forge_env.config import ConfigError, from_dict
from forge_env.generation import SamplingParams, WeightUpdateError
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer
from forge_env.rl import lora as rl_lora
from forge_env.rl.trainer import TorchTrainer, TrainerConfig
from forge_env.weights import WeightStore
from forge_env.weights.adapter import AdapterWeightSpecs, LoRAConfig
from tests.rl_support import LENGTHS, batch_of, on_policy, tiny_model

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
PROMPT = [5, 17, 42, 9, 100, 33]


def lora_trainer(store=None, **overrides):
    kwargs = {"device": "cpu", "loss": "grpo", "lr": 2e-2, "loss_kwargs": {"kl_coef": 0.0}, "lora": LORA}
    return TorchTrainer(tiny_model(), weight_store=store, **{**kwargs, **overrides})


def trained(trainer, steps=3):
    samples = on_policy(trainer, batch_of(LENGTHS))
    for _ in range(steps):
        trainer.train_step(samples)
    return trainer


def model_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lp = torch.log_softmax(model.eval()(ids).logits.float(), -1)[0]
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture
def store(request):
    store = WeightStore(f"lora-{request.node.name[:40]}", backend="ring")
    yield store
    store.clear()


def test_the_config_is_strict_and_suggests_close_names():
    assert from_dict(TrainerConfig, {"lora": {"rank": 8}}).lora == LoRAConfig(rank=8)
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.lora.rnak'; did you mean \['rank'\]"):
        from_dict(TrainerConfig, {"lora": {"rnak": 8}}, "trainer")
    for bad, match in [({"rank": 0}, "rank must be an integer >= 1"), ({"alpha": -1}, "alpha must be > 0"),
                       ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
                       ({"target_modules": "q_proj"}, "expected a list"),
                       ({"target_modules": []}, "non-empty list")]:
        with pytest.raises(ConfigError, match=match):
            from_dict(TrainerConfig, {"lora": bad}, "trainer")
    with pytest.raises(ConfigError, match=r"'q_porj' matches no linear layer of the model; did you mean \['q_proj'"):
        TorchTrainer(tiny_model(), device="cpu", lora={"target_modules": ["q_porj"]})
    peft_model = lora_trainer().model
    with pytest.raises(ValueError, match="the model carries a LoRA adapter"):
        TorchTrainer(peft_model, device="cpu")
    with pytest.raises(ConfigError, match="already carries a LoRA adapter \\(rank 4"):
        TorchTrainer(peft_model, device="cpu", lora={**LORA, "rank": 8})
    assert TorchTrainer(peft_model, device="cpu", loss="sft", lora=LORA).model is peft_model  # the warm-up's case


def test_only_the_adapter_trains_and_only_the_adapter_is_pushed(store):
    base = {k: v.clone() for k, v in tiny_model().state_dict().items()}
    trainer = trained(lora_trainer(store))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    after = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
             for k, v in trainer.model.state_dict().items() if ".lora_" not in k}
    assert after.keys() == base.keys() and all(torch.equal(after[k], base[k]) for k in base)
    pushed = trainer.state_dict_for_generators()
    assert any(torch.count_nonzero(v) for k, v in pushed.items() if ".lora_B." in k)  # B moved off zero
    info = trainer.push_weights(1)
    specs = AdapterWeightSpecs.for_model(tiny_model(), LoRAConfig(**LORA))
    assert set(pushed) == set(specs.specs) and info.num_bytes == specs.num_bytes == trainer.pushed_bytes
    full_bytes = sum(v.numel() * v.element_size() for v in tiny_model().state_dict().values())
    assert info.num_bytes < full_bytes / 4
    assert set(store.get(1)[0]) == set(pushed)


async def test_hf_generator_serves_base_plus_adapter_like_the_merged_model(store):
    trainer = trained(lora_trainer(store))
    trainer.push_weights(1)
    gen = HFGenerator(rl_lora.base_model_copy(trainer.model).eval(), build_byte_tokenizer(),
                      HFGeneratorConfig(lora=LORA), weight_source=store)
    merged = rl_lora.merged_model_copy(trainer.model)
    base = rl_lora.base_model_copy(trainer.model)
    try:
        sampling = SamplingParams(max_tokens=16, seed=7, ignore_eos=True)
        before = await gen.generate(PROMPT, sampling)  # no update yet: the base model
        assert before.logprobs == pytest.approx(model_logprobs(base, PROMPT, before.token_ids), abs=1e-4)
        await gen.update_weights(1)
        after = await gen.generate(PROMPT, sampling)
        assert after.policy_version == 1
        assert after.logprobs == pytest.approx(model_logprobs(merged, PROMPT, after.token_ids), abs=1e-4)
        assert after.logprobs != pytest.approx(model_logprobs(base, PROMPT, after.token_ids), abs=1e-3)
        # ... and the trainer's own logprobs of the sampled tokens agree with what the generator reported
        sample = on_policy(trainer, batch_of([(len(PROMPT), len(after.token_ids))]))[0]
        sample.token_ids = PROMPT + after.token_ids
        trainer_lp = trainer.logprobs([sample])[0][len(PROMPT):]
        assert after.logprobs == pytest.approx(trainer_lp, abs=1e-4)

        partial_base = dict(list(tiny_model().state_dict().items())[1:])  # no adapter names: a (broken) base
        with pytest.raises(WeightUpdateError, match=r"not this model's full set of base weights: missing 1"):
            await gen.load_state_dict(partial_base, 2)
        other = TorchTrainer(tiny_model(), device="cpu", lora={**LORA, "rank": 2})
        with pytest.raises(WeightUpdateError, match="wrong shapes"):
            await gen.load_state_dict(other.state_dict_for_generators(), 2)
        missing = dict(list(trainer.state_dict_for_generators().items())[1:])
        with pytest.raises(WeightUpdateError, match="missing 1 adapter tensors"):
            await gen.load_state_dict(missing, 2)
        assert gen.policy_version == 1
        again = await gen.generate(PROMPT, sampling)
        assert again.token_ids == after.token_ids and again.logprobs == pytest.approx(after.logprobs, abs=1e-6)
    finally:
        await gen.aclose()


def test_a_checkpoint_holds_the_adapter_alone_and_resumes_exactly(tmp_path):
    trainer = trained(lora_trainer())
    trainer.save(tmp_path / "ckpt")
    files = {p.relative_to(tmp_path / "ckpt").as_posix() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    assert files == {"adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                     "trainer_state.safetensors", "trainer_state.json"}
    adapter_bytes = (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < 0.25 * sum(v.numel() * 4 for v in tiny_model().state_dict().values())
    # PEFT reads it as its own adapter directory
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(tiny_model(), str(tmp_path / "ckpt" / "adapter"))
    tokens = [3, 4, 5, 6]
    assert model_logprobs(peft_model, PROMPT, tokens) == pytest.approx(
        model_logprobs(rl_lora.merged_model_copy(trainer.model), PROMPT, tokens), abs=1e-5)

    resumed = lora_trainer()
    resumed.load(tmp_path / "ckpt")
    assert resumed.step == trainer.step
    probe = batch_of(LENGTHS, seed=3)
    assert resumed.logprobs(probe) == trainer.logprobs(probe)
    next_batch = on_policy(trainer, batch_of(LENGTHS, seed=1))
    assert resumed.train_step(next_batch)["loss"] == pytest.approx(trainer.train_step(next_batch)["loss"], abs=1e-7)
    flat = [v for row in resumed.logprobs(probe) for v in row]
    assert flat == pytest.approx([v for row in trainer.logprobs(probe) for v in row], abs=1e-6)

    with pytest.raises(FileNotFoundError, match="holds a LoRA adapter, not full weights"):
        TorchTrainer(tiny_model(), device="cpu").load(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match="adapter of rank 4"):
        lora_trainer(lora={**LORA, "rank": 8}).load(tmp_path / "ckpt")
    full = TorchTrainer(tiny_model(), device="cpu")
    full.save(tmp_path / "full")
    with pytest.raises(FileNotFoundError, match="holds no LoRA adapter"):
        lora_trainer().load(tmp_path / "full")


def test_titan_trainer_refuses_lora_when_configured():
    from agents.train.config import load_grpo_config
    from forge_env.rl.titan_config import TitanTrainerConfig

    with pytest.raises(ConfigError, match="not supported with trainer.backend=titan"):
        TitanTrainerConfig(lora={"rank": 8})
    with pytest.raises(ConfigError, match="trainer.lora is not supported with trainer.backend=titan"):
        load_grpo_config(None, ["trainer.backend=titan", "trainer.config.lora={rank: 8}"]).validate()


def test_the_generator_config_takes_the_trainers_adapter():
    from agents.train.components import generator_config
    from agents.train.config import load_grpo_config

    config = load_grpo_config(None, ["trainer.config.lora={rank: 8, alpha: 16}"])
    assert generator_config(config)["lora"] == {"rank": 8, "alpha": 16.0, "target_modules": list(
        LoRAConfig().target_modules), "dropout": 0.0}
    with pytest.raises(ConfigError, match="generator.config.lora: the generators serve the adapter"):
        load_grpo_config(None, ["generator.config.lora={rank: 8}"]).validate()


def test_full_weights_needs_lora_and_a_warm_up():
    from agents.train.config import load_grpo_config

    for extra in ([], ["trainer.config.lora={rank: 8}"]):
        with pytest.raises(ConfigError, match="sft.full_weights .* needs sft.enabled=true and trainer.config.lora"):
            load_grpo_config(None, ["sft.full_weights=true", *extra]).validate()
    load_grpo_config(None, ["sft.full_weights=true", "sft.enabled=true", "trainer.config.lora={rank: 8}"]).validate()


async def test_a_lora_generator_takes_a_full_update_as_its_new_base(store):
    trainer = trained(lora_trainer(store))
    gen = HFGenerator(tiny_model(seed=5).eval(), build_byte_tokenizer(), HFGeneratorConfig(lora=LORA),
                      weight_source=store)
    try:
        trainer.push_weights(1)
        await gen.update_weights(1)  # an adapter on the generator's own (other) base
        trainer.push_weights(2, full=True)
        assert not any(".lora_" in k for k in store.get(2)[0])
        await gen.update_weights(2)  # the trainer's base, adapter reset: the base policy
        sampling = SamplingParams(max_tokens=12, seed=3, ignore_eos=True)
        base_out = await gen.generate(PROMPT, sampling)
        base = rl_lora.base_model_copy(trainer.model)
        assert base_out.logprobs == pytest.approx(model_logprobs(base, PROMPT, base_out.token_ids), abs=1e-4)
        trainer.push_weights(3)
        await gen.update_weights(3)  # base + adapter: the trainer's policy
        out = await gen.generate(PROMPT, sampling)
        merged = rl_lora.merged_model_copy(trainer.model)
        assert out.logprobs == pytest.approx(model_logprobs(merged, PROMPT, out.token_ids), abs=1e-4)
    finally:
        await gen.aclose()


def base_of(model):
    from forge_env.weights.adapter import base_state_dict

    return {k: v.clone() for k, v in base_state_dict(model).items()}


async def generator_follows_trainer(generator, trainer):
    completion = await generator.generate(PROMPT, SamplingParams(max_tokens=12, seed=1, ignore_eos=True))
    sample = batch_of([(len(PROMPT), len(completion.token_ids))])[0]
    sample.token_ids = PROMPT + completion.token_ids
    assert completion.logprobs == pytest.approx(trainer.logprobs([sample])[0][len(PROMPT):], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("service", [False, True], ids=["in-process", "monarch-service"])
async def test_demo_lora_warms_up_every_weight_then_trains_an_adapter_on_that_base_and_resumes(tmp_path, service):
    """The GRPO app with the demo's --lora overrides, shrunk: the warm-up trains every weight; RL then
    trains a fresh adapter on the warmed-up base (frozen, bit for bit), the generators get that base in one
    full push and the adapter after every step (their logprobs follow the trainer's), and a resumed run
    gets base and adapter back from the checkpoint (the base written once, under checkpoints/base)."""
    import argparse
    import json

    from agents.train.commands import LORA_DEMO_OVERRIDES, add_demo_arguments
    from agents.train.components import build_components, build_reference
    from agents.train.config import load_grpo_config
    from agents.train.loop import GRPOLoop
    from agents.train.metrics import MetricsLogger
    from forge_env.models import TINY_MODEL_ID, load_model_and_tokenizer
    from tests.test_train_loop import SMALL

    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    assert parser.parse_args(["--lora"]).lora
    args = [*SMALL, *LORA_DEMO_OVERRIDES, f"loop.output_dir={tmp_path / 'run'}", "loop.steps=2",
            f"generator.service={str(service).lower()}", "env.service.backend=local", "eval.num_tasks=0",
            "sft.enabled=true", "sft.steps=3", "sft.batch_size=2", "sft.num_demonstrations=4", "sft.lr=1e-2"]
    config = load_grpo_config(None, args)
    assert config.trainer.config.lora.rank == 32 and config.sft.full_weights
    random_model = load_model_and_tokenizer(TINY_MODEL_ID, seed=0)[0]
    random_base = random_model.state_dict()
    lora_config = config.trainer.config.lora
    components = await build_components(config)
    logger = MetricsLogger(tmp_path / "logs", tensorboard=False)
    try:
        loop = GRPOLoop(config, components, logger)
        await loop.start()  # the full warm-up, the adapter attached, the base pushed in full, then version 0
        trainer, generator = components.trainer, components.generator
        warmed = base_of(trainer.model)
        assert warmed.keys() == random_base.keys()
        assert any(not torch.equal(warmed[k], random_base[k]) for k in random_base)  # the warm-up moved the base
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all(".lora_" in n for n in trainable)
        assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == {
            id(p) for p in trainer.model.parameters() if p.requires_grad}
        adapter_before = {k: v.clone() for k, v in trainer.state_dict_for_generators().items()}
        assert not any(torch.count_nonzero(v) for k, v in adapter_before.items() if ".lora_B." in k)
        await generator_follows_trainer(generator, trainer)  # the generator serves the warmed-up base

        for seed in (1, 2):  # two RL steps of the app (the tiny warmed-up model earns no reward: hand-made
            # advantages, so the adapter has something to learn), each pushed to the generator
            await loop.train_step(on_policy(trainer, batch_of(LENGTHS, seed=seed)))
        assert loop.state.step == 2 and generator.policy_version == 2
        assert all(torch.equal(v, warmed[k]) for k, v in base_of(trainer.model).items())  # bit for bit
        adapter = trainer.state_dict_for_generators()
        assert max(float((adapter[k] - adapter_before[k]).abs().max()) for k in adapter) > 1e-4
        await generator_follows_trainer(generator, trainer)
        adapter_bytes = AdapterWeightSpecs.for_model(random_model, lora_config).num_bytes
        assert trainer.pushed_bytes > 3 * adapter_bytes  # the full base once, then the adapter 3 times

        checkpoint = loop.checkpoint()
        root = tmp_path / "run" / "checkpoints"
        assert json.loads((checkpoint / "loop_state.json").read_text())["base_checkpoint"] == "base"
        assert (root / "base" / "model.safetensors").is_file()
        assert (checkpoint / "trainer" / "adapter" / "adapter_model.safetensors").is_file()
        assert not (checkpoint / "trainer" / "model.safetensors").exists()
        probe = batch_of(LENGTHS, seed=7)
        expected = trainer.logprobs(probe)
        # a KL term's reference is the warmed-up base, not the moved policy
        reference = build_reference(load_grpo_config(None, [*args, "trainer.config.loss_kwargs.kl_coef=0.04"]),
                                    trainer)
        warmed_model = rl_lora.base_model_copy(trainer.model)
        probe_tokens = probe[0].token_ids
        ref_lp = reference.logprobs([probe[0]])[0][1:]
        assert ref_lp == pytest.approx(model_logprobs(warmed_model, probe_tokens[:1], probe_tokens[1:]), abs=1e-4)
        assert max(abs(a - b) for a, b in zip(ref_lp, expected[0][1:], strict=True)) > 1e-2  # the policy moved
    finally:
        logger.close()
        await components.close()

    resumed_config = load_grpo_config(None, [*args, "loop.resume=true"])
    components = await build_components(resumed_config)
    logger = MetricsLogger(tmp_path / "logs2", tensorboard=False)
    try:
        loop = GRPOLoop(resumed_config, components, logger)
        await loop.start()
        trainer = components.trainer
        assert loop.state.step == 2 and components.generator.policy_version == 2
        assert all(torch.equal(v, warmed[k]) for k, v in base_of(trainer.model).items())
        assert all(torch.equal(v, adapter[k]) for k, v in trainer.state_dict_for_generators().items())
        flat = [v for row in trainer.logprobs(probe) for v in row]
        assert flat == pytest.approx([v for row in expected for v in row], abs=1e-6)
        await generator_follows_trainer(components.generator, trainer)
    finally:
        logger.close()
        await components.close()
