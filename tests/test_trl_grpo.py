"""Issue 35 (item 3): TRL's GRPOTrainer trains the tiny model on a forge-env env through ``rollout_func``."""

import pytest
import torch
import trl  # noqa: F401  (the dev extra ships it: a missing TRL fails here, not a skip)

from agents.trl_rollout import ForgeEnvRollout, forge_reward, task_key
from forge_env import AnswerOutcome, TextEnv
from forge_env.generation.base import SamplingParams
from forge_env.models import build_byte_tokenizer, build_tiny_model
from tests.test_rollout import STOP_ON_LETTERS  # a random model's turns end at its first letter


class VowelEnv(TextEnv):
    """Two attempts: the first answer gets "Again." (env tokens inside the completion), the second is scored by
    its share of vowels, so a random model's episodes get different rewards (non-zero GRPO advantages)."""

    def __init__(self, **kw):
        super().__init__(tasks=[{"question": "Say a word."}, {"question": "Say another word."}], max_turns=3, **kw)

    async def on_final_answer(self, message, state):
        if state.data.setdefault("answers", 0) == 0:
            state.data["answers"] = 1
            return AnswerOutcome(reward=0.0, done=False, messages=[{"role": "user", "content": "Again."}])
        text = message["content"]
        return AnswerOutcome(reward=sum(ch in "aeiou" for ch in text) / max(len(text), 1), done=True)


def test_grpo_trainer_trains_two_steps_on_multi_turn_episodes_with_forge_env_rewards(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer()
    model = build_tiny_model(seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rollout = ForgeEnvRollout(VowelEnv, tokenizer, env_id="tests/Vowel-v0",
                              sampling=SamplingParams(temperature=1.0, max_tokens=40, seed=0,
                                                      stop_token_ids=STOP_ON_LETTERS))
    seen_rewards = []

    def reward(prompts, completions, **kwargs):
        values = forge_reward(prompts, completions, **kwargs)
        seen_rewards.extend(values)
        return values

    config = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
                        num_generations=4, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                        save_strategy="no", beta=0.0, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=ForgeEnvRollout.dataset([0, 1, 2, 3]), processing_class=tokenizer,
                          rollout_func=rollout)
    trainer.train()

    assert trainer.state.global_step == 2
    episodes = rollout.trajectories
    assert len(episodes) == 8 and len(seen_rewards) == 8
    # TRL's rewards are forge-env's, episode for episode, and they vary (so the step has a gradient).
    assert seen_rewards == [t.reward for t in episodes] and len(set(seen_rewards)) > 1
    # Multi-turn, token-exact: the completion holds the env's reply, masked out; the sampled tokens are trained.
    for trajectory in episodes:
        fields = ForgeEnvRollout.completion(trajectory)
        assert trajectory.ok and fields["prompt_ids"] + fields["completion_ids"] == trajectory.token_ids
        assert fields["env_mask"] == trajectory.loss_mask[trajectory.turns[0].gen_start:]
        assert fields["logprobs"] == trajectory.logprobs[trajectory.turns[0].gen_start:]
    two_turns = [t for t in episodes if len(t.turns) == 2]
    assert two_turns
    for trajectory in two_turns:  # "Again." and the template between the turns are in the completion, not trained
        fields = ForgeEnvRollout.completion(trajectory)
        assert sum(fields["env_mask"]) == trajectory.num_sampled_tokens < len(fields["completion_ids"])
        assert trajectory.turns[1].gen_start > trajectory.turns[0].gen_end
    assert {t.turns[0].policy_version for t in episodes} == {0, 1}  # the second step sampled with updated weights
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed
    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert logged == pytest.approx([sum(seen_rewards[:4]) / 4, sum(seen_rewards[4:]) / 4])


def test_rollout_func_refuses_rows_it_did_not_make():
    rollout = ForgeEnvRollout(VowelEnv, build_byte_tokenizer())
    with pytest.raises(ValueError, match="not a forge-env task key"):
        rollout(["What is 2+2?"], trainer=None)
    assert ForgeEnvRollout.dataset([5])["prompt"] == [task_key(5)]
