"""Template drift through the rollout: reported per turn in the trajectory and in the rollout summaries, never
when token-exact; the two reasoning modes of a Qwen3-style template."""

import pytest

import forge_env
from agents.groups import Progress
from agents.rollout import run_episode
from agents.train.evaluation import summarise
from forge_env import AnswerOutcome, TextEnv, tool
from forge_env.chat import ChatRenderer
from forge_env.chat_drift import CONTROL_TOKEN
from forge_env.generation.base import Completion, SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model
from tests import chat_templates as T

pytestmark = pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")

STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=8))
    yield tokenizer, generator
    generator.close()


async def play_math(generator, renderer, seed):
    env = forge_env.make("forge_env/Math-v0", max_attempts=3, max_turns=3, system_prompt="Answer briefly.")
    sampling = SamplingParams(temperature=1.0, max_tokens=24, stop_token_ids=STOP_ON_LETTERS, seed=seed)
    return await run_episode(env, generator, renderer, sampling=sampling, seed=seed, episode_id=f"e{seed}")


async def test_real_model_episodes_report_a_moving_system_prompt_and_nothing_on_an_exact_template(kit):
    tokenizer, generator = kit
    moving = ChatRenderer(tokenizer, chat_template=T.MISTRAL_NEMO)
    exact = ChatRenderer(tokenizer)  # the tiny model's own (prefix-preserving) template
    drifted, clean = [], []
    for seed in range(3):
        drifted.append(await play_math(generator, moving, seed))
        clean.append(await play_math(generator, exact, seed))
    multi = [t for t in drifted if t.ok and len(t.turns) > 1]
    assert multi, "the random model should need several attempts in some episode"
    for trajectory in multi:  # "try again" is the new last user turn: the system text leaves turn 0's prompt
        first = trajectory.drift[0]
        assert (first["turn"], first["where"], first["kind"]) == (0, "context", "rerendered")
        assert first["held"].startswith("Answer briefly.")
        trajectory.check()
    # the exact template re-renders nothing; a control token the random model samples mid-turn is recorded
    # as the sample's doing (control_token), never as template drift
    assert all(t.ok and not t.drifted for t in clean)
    assert all(record["kind"] == CONTROL_TOKEN for t in clean for record in t.drift)
    assert summarise(drifted).template_drift == len(multi) and summarise(clean).template_drift == 0
    progress = Progress(every_s=0)
    progress.update(drifted)
    assert f"template drift in {len(multi)}" in progress.summary()
    assert moving.stats["drift_checks"] > 0 and exact.stats["non_prefix_preserving"] == 0


# ----------------------------------------------------------------------------- reasoning modes (Qwen3-style)

class ScriptedPolicy:
    """Stands in for a reasoning model's choice of tokens (no such model runs here): it returns the given
    turns in order, tokenized, and records the prompts the rollout fed it."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, prompt_ids, sampling, session_id=None):
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[-0.5] * len(ids), text="",
                          finish_reason="stop", policy_version=3)

    async def release_session(self, session_id):
        pass


class AddEnv(TextEnv):
    """Adds with a tool; the first final answer is questioned ("Are you sure?"), the second ends the episode."""

    def __init__(self, **kw):
        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        super().__init__(tasks=[{"question": "What is 1+2?"}], tools=[add], max_turns=5, **kw)

    async def on_final_answer(self, message, state):
        if state.data.setdefault("answers", 0) == 0:
            state.data["answers"] = 1
            return AnswerOutcome(reward=0.0, done=False, messages=[{"role": "user", "content": "Are you sure?"}])
        return AnswerOutcome(reward=1.0, done=True)


QWEN3_TURNS = [
    '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>',
    "<think>\nGot 3.\n</think>\n\nThe answer is 3.<|im_end|>",
    "<think>\nYes.\n</think>\n\nYes, 3.<|im_end|>",
]


@pytest.mark.parametrize("mode", ["keep", "rerender"])
async def test_qwen3_reasoning_is_kept_or_re_rendered_as_declared(mode):
    tokenizer = build_byte_tokenizer()
    renderer = ChatRenderer(tokenizer, chat_template=T.QWEN3, reasoning=mode, strict=True)
    policy = ScriptedPolicy(tokenizer, QWEN3_TURNS)
    trajectory = await run_episode(AddEnv(), policy, renderer, seed=0)
    assert trajectory.ok and trajectory.reward == 1.0 and len(trajectory.turns) == 3
    trajectory.check()
    for turn, text in zip(range(3), QWEN3_TURNS, strict=True):  # sampled tokens verbatim in both modes
        assert trajectory.sampled_ids(turn) == tokenizer(text, add_special_tokens=False)["input_ids"]
    # the tool loop (turn 0 -> 1) is token-exact either way: no false alarm, strict does not raise
    assert policy.prompts[1][: len(policy.prompts[0])] == policy.prompts[0]
    serve_render = renderer.rerender(trajectory.messages[:-1], trajectory.tools)  # what a server would feed turn 2
    if mode == "keep":
        assert policy.prompts[2][: len(policy.prompts[1])] == policy.prompts[1]
        assert [(d["turn"], d["where"], d["kind"]) for d in trajectory.drift] == [(0, "sampled", "reasoning_dropped")]
        assert trajectory.segment_starts == [0] and len(trajectory.to_samples()) == 1
        assert policy.prompts[2] != serve_render
    else:
        assert trajectory.drift == [] and len(trajectory.segment_starts) == 2
        assert policy.prompts[2] == serve_render  # exactly what the model sees when served
        assert "Add them." not in tokenizer.decode(policy.prompts[2])
        samples = trajectory.to_samples(advantage=0.5)
        assert [sum(s.loss_mask) for s in samples] == [len(trajectory.sampled_ids(0)) + len(trajectory.sampled_ids(1)),
                                                       len(trajectory.sampled_ids(2))]
        assert samples[1].token_ids == policy.prompts[2] + trajectory.sampled_ids(2)
        assert all(s.advantage == 0.5 for s in samples)
        with pytest.raises(ValueError, match="to_samples"):
            trajectory.to_sample()


# ----------------------------------------------------------------------------- gpt-oss with its special tokens

HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]


async def test_gpt_oss_tool_loop_with_special_tokens_stops_at_call_and_is_exact():
    tokenizer = build_byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
    renderer = ChatRenderer(tokenizer, chat_template=T.GPT_OSS, strict=True)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in HARMONY_TOKENS}
    assert renderer.parser == "harmony"
    assert set(renderer.stop_token_ids) == {ids["<|call|>"], ids["<|return|>"]}  # not <|end|>: it ends a message
    turns = [
        "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>commentary to=functions.add "
        '<|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>',
        "<|channel|>analysis<|message|>Got 3.<|end|><|start|>assistant<|channel|>final<|message|>3<|return|>",
    ]

    class RecordingPolicy(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling, session_id=None):
            self.sampling = sampling
            return await super().generate(prompt_ids, sampling, session_id)

    class OneAnswerEnv(AddEnv):
        async def on_final_answer(self, message, state):
            return AnswerOutcome(reward=float(message["content"] == "3"), done=True)

    policy = RecordingPolicy(tokenizer, turns)
    trajectory = await run_episode(OneAnswerEnv(tool_parser=renderer.parser), policy, renderer, seed=0)
    assert trajectory.ok, trajectory.error
    assert trajectory.reward == 1.0 and trajectory.drift == []  # special tokens decoded, parsed, token-exact
    assert ids["<|call|>"] in policy.sampling.stop_token_ids
    assert policy.prompts[1][: len(policy.prompts[0])] == policy.prompts[0]
    tool_reply = tokenizer.decode(policy.prompts[1][len(policy.prompts[0]) + len(trajectory.sampled_ids(0)):])
    assert tool_reply == '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"3"<|end|><|start|>assistant'
