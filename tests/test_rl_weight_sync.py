"""Weight sync end to end: the trainer pushes version k through the shared-memory WeightStore; a
generator in another Monarch process updates, reports policy_version k and generates what the
trainer's model generates (same greedy tokens, same logprobs)."""

import torch

from forge_env.rl.trainer import TorchTrainer
from forge_env.weights import WeightStore
from tests.rl_actors import TinyPolicyGenerator
from tests.rl_support import sample, tiny_model

PROMPT = [5, 17, 42, 9, 100, 7]
NEW_TOKENS = 8


def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


async def test_generator_in_another_process_follows_pushed_versions(tmp_path):
    store = WeightStore("sync-test", root=tmp_path / "weights")
    trainer = TorchTrainer(tiny_model(seed=0), device="cpu", loss="sft", lr=2e-2, weight_store=store)
    batch = [sample(PROMPT, [200, 201, 202, 203]), sample([8, 9], [150, 151, 152])]
    for _ in range(3):
        trainer.train_step(batch)

    generator = await TinyPolicyGenerator.options(procs=1).as_actor(store, seed=7)  # different weights
    try:
        assert await generator.policy_version.call_one() == 0
        before = await generator.generate.call_one(PROMPT, NEW_TOKENS)

        trainer.push_weights(3)
        expected_v3 = greedy(trainer.model, PROMPT, NEW_TOKENS)
        assert await generator.update_weights.call_one(3) == 3
        assert await generator.policy_version.call_one() == 3
        after = await generator.generate.call_one(PROMPT, NEW_TOKENS)

        trainer.train_step(batch)
        trainer.push_weights(4)
        assert await generator.update_weights.call_one(4) == 4
        latest = await generator.generate.call_one(PROMPT, NEW_TOKENS)
    finally:
        await TinyPolicyGenerator.shutdown(generator)

    trainer.model.eval()
    expected = greedy(trainer.model, PROMPT, NEW_TOKENS)
    assert latest.policy_version == 4 and after.policy_version == 3
    assert latest.token_ids == expected
    assert after.token_ids == expected_v3
    trainer_lp = trainer.logprobs([sample(PROMPT, latest.token_ids)])[0][len(PROMPT):]
    assert torch.allclose(torch.tensor(latest.logprobs), torch.tensor(trainer_lp), atol=1e-4)
    # The update is what made them agree: before it, the generator's own weights scored differently.
    before_lp = trainer.logprobs([sample(PROMPT, before.token_ids)])[0][len(PROMPT):]
    assert not torch.allclose(torch.tensor(before.logprobs), torch.tensor(before_lp), atol=1e-2)
