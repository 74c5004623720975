"""TrainerActor and ReferenceActor in their own Monarch processes: reference logprobs feed the KL
term, the trainer learns, and its pushed weights land in the shared WeightStore."""

import asyncio

from forge_env.rl.trainer import TrainerConfig
from forge_env.rl.trainer_actor import ReferenceActor, TrainerActor
from forge_env.weights import WeightStore
from tests.rl_support import sample, tiny_model


async def test_trainer_and_reference_actors(tmp_path):
    store = WeightStore("actor-test", root=tmp_path / "weights")
    model = (tiny_model, {"seed": 0})
    config = TrainerConfig(loss="grpo", lr=1e-3, loss_kwargs={"kl_coef": 0.05}, device="cpu")
    trainer, reference = await asyncio.gather(
        TrainerActor.options(procs=1).as_actor(model, config, weight_store=store),
        ReferenceActor.options(procs=1).as_actor(model, device="cpu"),
    )
    try:
        batch = [sample([5, 6, 7], [100, 101, 1], advantage=1.0, group_id="g"),
                 sample([5, 6, 7], [200, 201, 1], advantage=-1.0, group_id="g")]  # fmt: skip
        batch = await reference.annotate.call_one(batch)
        current = await trainer.logprobs.call_one(batch)
        assert current == [s.ref_logprobs for s in batch]  # same seed, same model, before training
        for s, lp in zip(batch, current, strict=True):
            s.old_logprobs = [v if m else 0.0 for v, m in zip(lp, s.loss_mask, strict=True)]
        metrics = [await trainer.train_step.call_one(batch) for _ in range(3)]
        assert metrics[0]["kl"] == 0.0 and metrics[-1]["kl"] > 0.0
        assert metrics[-1]["pg_loss"] < metrics[0]["pg_loss"]
        info = await trainer.push_weights.call_one(await trainer.step.call_one())
    finally:
        await asyncio.gather(TrainerActor.shutdown(trainer), ReferenceActor.shutdown(reference))
    assert info.version == 3 and store.latest_version() == 3
    fresh = tiny_model(seed=5)
    store.load_into(fresh)
    assert not all(
        (a == b).all() for a, b in zip(fresh.parameters(), tiny_model(seed=0).parameters(), strict=True)
    )
