"""Issue 35 (item 4): trajectories and eval results as Parquet files and ``datasets.Dataset``s with a fixed schema."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agents.trajectory_table as table_mod
from agents.cli import main
from agents.eval.export import RESULTS_FILE, load_eval, write_eval_parquet
from agents.eval.metrics import summarize
from agents.groups import GroupRequest, rollout_group
from agents.rollout import run_episode
from agents.sft import demonstration_samples, trajectory_demonstrations
from agents.trajectory import ERROR_ENDPOINT, LEVEL_MESSAGE, STATUS_ERROR, Trajectory, Turn
from agents.trajectory_table import (
    TRAJECTORY_SCHEMA,
    TRAJECTORY_SCHEMA_VERSION,
    TrajectorySchemaError,
    from_dataset,
    from_table,
    read_parquet,
    read_trajectories,
    to_dataset,
    to_table,
    write_parquet,
    write_trajectories,
)
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model, save_tiny_model
from tests import chat_templates as T
from tests.test_rollout import STOP_ON_LETTERS
from tests.test_rollout_drift import QWEN3_TURNS, AddEnv, ScriptedPolicy

HERMES_TURNS = [
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>',  # as the tiny template
    "The answer is 3.<|im_end|>",
    "Yes, 3.<|im_end|>",
]


async def scripted_episode(turns, chat_template=None, mode="keep"):
    """A real episode of a tool env (tool call, env feedback, reward 1) with a scripted policy's tokens."""
    tokenizer = build_byte_tokenizer()
    renderer = ChatRenderer(tokenizer, chat_template=chat_template, reasoning=mode)
    trajectory = await run_episode(AddEnv(), ScriptedPolicy(tokenizer, turns), renderer, seed=0)
    assert trajectory.ok and trajectory.reward == 1.0, trajectory.error
    return trajectory, renderer


def message_level_trajectory():
    """What a chat-API eval episode holds: structured tool calls, usage, no tokens; here it also failed."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    return Trajectory(
        episode_id="task7-s0", env_id="forge_env/ToolUse-v0", group_id="task7", seed=None,
        task={"question": "What is 1+2?", "nested": {"k": [1, 2.5, None]}},
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2?"},
                  {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "add"},
                  {"role": "tool", "content": "3", "tool_call_id": "call_1", "name": "add"},
                  {"role": "assistant", "content": [{"type": "text", "text": "3"}], "refusal": None}],
        turns=[Turn(0, 0, 0, 0, "tool_calls"), Turn(0, 0, 0, 0, "stop", reward=1.0)],
        reward=1.0, terminated=True, status=STATUS_ERROR, error="endpoint down", error_kind=ERROR_ENDPOINT,
        level=LEVEL_MESSAGE, endpoint_retries=3, usage={"prompt_tokens": 40, "completion_tokens": 9},
        metrics={"correct": 1.0, "format": 0.5}, total_s=1.25)


# ----------------------------------------------------------------------------- round trips


async def test_tool_calling_episode_with_drift_round_trips_through_parquet_and_datasets(tmp_path):
    trajectory, _ = await scripted_episode(QWEN3_TURNS, T.QWEN3, "keep")
    assert trajectory.task == {} and trajectory.drift and trajectory.tools  # an empty task: "{}" in the file
    rerendered, _ = await scripted_episode(QWEN3_TURNS, T.QWEN3, "rerender")
    assert len(rerendered.segment_starts) == 2
    episodes = [trajectory, rerendered, message_level_trajectory(), Trajectory(episode_id="empty")]

    # What JSONL rows did before: Arrow cannot hold the empty task as a struct.
    with pytest.raises(pa.ArrowNotImplementedError, match="no child field"):
        pq.write_table(pa.Table.from_pylist([trajectory.to_dict()]), str(tmp_path / "naive.parquet"))

    path = tmp_path / "episodes.parquet"
    write_parquet(episodes, path)
    assert pq.read_schema(str(path)).remove_metadata() == TRAJECTORY_SCHEMA.remove_metadata()
    assert read_parquet(path) == episodes
    assert from_table(to_table(episodes)) == episodes
    dataset = to_dataset(episodes)
    assert dataset.num_rows == 4 and set(dataset["schema_version"]) == {TRAJECTORY_SCHEMA_VERSION}
    assert from_dataset(dataset) == episodes
    # A dataset loaded by `datasets` itself from the file, filtered, comes back as the same trajectories.
    loaded = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "cache"))
    assert from_dataset(loaded) == episodes
    assert from_dataset(loaded.filter(lambda row: row["level"] == "token")) == episodes[:2] + episodes[3:]
    assert [t.to_samples(advantage=0.5) for t in read_parquet(path)[:2]] == \
        [t.to_samples(advantage=0.5) for t in episodes[:2]]
    # Re-saved by `datasets` (its own metadata), still this schema.
    loaded.to_parquet(str(tmp_path / "resaved.parquet"))
    assert read_trajectories(tmp_path / "resaved.parquet") == episodes


async def test_tiny_model_rollouts_round_trip_token_exact(tmp_path):
    """Real sampler output (float32 logprobs) survives the float32 column exactly."""
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=4))
    try:
        import forge_env

        group = await rollout_group(lambda: forge_env.make("forge_env/Math-v0", max_attempts=3, max_turns=3),
                                    generator, ChatRenderer(tokenizer), GroupRequest(seed=1, n=2, group_id="g"),
                                    sampling=SamplingParams(temperature=1.0, max_tokens=30, seed=4,
                                                            stop_token_ids=STOP_ON_LETTERS))
    finally:
        generator.close()
    assert all(t.ok and t.num_sampled_tokens and len(t.turns) > 1 for t in group)
    assert any(lp != 0.0 for t in group for lp in t.logprobs)
    write_trajectories(group, tmp_path / "g.parquet")
    write_trajectories(group, tmp_path / "g.jsonl")
    assert read_trajectories(tmp_path / "g.parquet") == group == read_trajectories(tmp_path / "g.jsonl")


# ----------------------------------------------------------------------------- older files and JSONL

OLD_JSONL_LINE = json.dumps({  # a row as `forge-env rollout` wrote it before error_kind/level/usage/drift existed
    "episode_id": "task3-0", "env_id": "forge_env/Arithmetic-v0", "group_id": "task3", "seed": 3,
    "task": {"question": "2+2"}, "token_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "logprobs": [0.0, -0.5, -1.0],
    "turns": [{"prompt_start": 0, "gen_start": 1, "gen_end": 3, "policy_version": 0, "finish_reason": "stop",
               "num_cached_tokens": 0, "reward": 1.0, "generation_s": 0.1, "env_s": 0.0}],
    "messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}], "tools": [],
    "reward": 1.0, "terminated": True, "truncated": False, "truncation_reason": None, "status": "ok", "error": None,
    "metrics": {}, "generation_s": 0.1, "env_s": 0.0, "total_s": 0.2})


def test_old_jsonl_files_load_and_convert_to_parquet(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(OLD_JSONL_LINE + "\n")
    [trajectory] = read_trajectories(old)
    assert trajectory.segment_starts == [0] and trajectory.drift == [] and trajectory.level == "token"
    trajectory.check()
    write_trajectories([trajectory], tmp_path / "new.parquet")
    assert read_trajectories(tmp_path / "new.parquet") == [trajectory]
    with pytest.raises(ValueError, match="unknown trajectory file type '.csv'"):
        read_trajectories(tmp_path / "x.csv")


def test_a_file_of_a_previous_schema_version_gets_the_newer_columns_defaults(tmp_path, monkeypatch):
    """Version 1 is the first: this plays the next version adding a column (``total_s`` here stands in for it)."""
    path = tmp_path / "v1.parquet"
    episode = message_level_trajectory()
    pq.write_table(to_table([episode]).drop_columns(["total_s"]), str(path))
    with pytest.raises(TrajectorySchemaError, match="missing column 'total_s'"):
        read_parquet(path)  # to version 1 the column is required
    monkeypatch.setattr(table_mod, "TRAJECTORY_SCHEMA_VERSION", 2)
    monkeypatch.setitem(table_mod.COLUMN_SINCE, "total_s", 2)
    [loaded] = read_parquet(path)
    assert loaded.total_s == 0.0 and loaded.messages == episode.messages and loaded.usage == episode.usage
    monkeypatch.undo()
    newer = to_table([episode]).set_column(0, "schema_version", pa.array([2], pa.int32()))
    with pytest.raises(TrajectorySchemaError, match="schema version 2, newer than this reader's 1"):
        from_table(newer)


# ----------------------------------------------------------------------------- not this schema


@pytest.mark.parametrize("damage, message", [
    (lambda t: pa.table({"text": ["hello"]}), "missing column 'schema_version'"),
    (lambda t: t.drop_columns(["loss_mask"]), "missing column 'loss_mask'"),
    (lambda t: t.set_column(t.schema.get_field_index("token_ids"), "token_ids",
                            pa.array([["a", "b"]], pa.list_(pa.string()))),
     "column 'token_ids' has type list<element: string>, the schema has list<item: int32>"),
    (lambda t: t.set_column(t.schema.get_field_index("task"), "task", pa.array(["{not json"])),
     "column 'task', row 0: not JSON"),
    (lambda t: t.set_column(t.schema.get_field_index("tools"), "tools", pa.array(['{"a": 1}'])),
     "column 'tools', row 0: JSON dict, expected list"),
    (lambda t: t.set_column(t.schema.get_field_index("episode_id"), "episode_id", pa.array([None], pa.string())),
     "column 'episode_id' has 1 null values"),
])
def test_a_table_of_another_layout_names_the_bad_column(tmp_path, damage, message):
    path = tmp_path / "bad.parquet"
    pq.write_table(damage(to_table([message_level_trajectory()])), str(path))
    with pytest.raises(TrajectorySchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_parquet(path)


def test_compatible_types_are_cast_and_extra_columns_ignored():
    table = to_table([message_level_trajectory()])
    index = table.schema.get_field_index("token_ids")
    table = table.set_column(index, "token_ids", pa.array([[]], pa.list_(pa.int64())))
    table = table.append_column("split", pa.array(["train"]))
    assert from_table(table) == [message_level_trajectory()]


def test_not_a_parquet_file_and_unwritable_values_are_clear_errors(tmp_path):
    (tmp_path / "x.parquet").write_text("episode_id,reward\n")
    with pytest.raises(TrajectorySchemaError, match="not a Parquet file"):
        read_parquet(tmp_path / "x.parquet")
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_parquet(tmp_path / "missing.parquet")
    with pytest.raises(TrajectorySchemaError, match="does not fit int32"):
        to_table([Trajectory(episode_id="e", token_ids=[2**40], loss_mask=[0], logprobs=[0.0])])
    with pytest.raises(ValueError, match="must end in .parquet or .jsonl"):
        from agents.commands import rollout_command

        rollout_command(type("Args", (), {"n": 1, "group_size": 1, "out": "x.csv", "env_kwargs": "{}"})())


# ----------------------------------------------------------------------------- CLI, eval results, SFT


def test_rollout_command_writes_parquet_that_datasets_and_view_read(tmp_path):
    out = tmp_path / "rollouts.parquet"
    assert main(["rollout", "forge_env/Arithmetic-v0", "--n", "2", "--group-size", "2", "--out", str(out),
                 "--max-tokens", "8", "--seed", "3", "--device", "cpu"]) == 0
    dataset = datasets.Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "cache"))
    assert dataset.num_rows == 2 and set(dataset["group_id"]) == {"task3"}
    trajectories = from_dataset(dataset)
    for trajectory in trajectories:
        trajectory.check()
    assert json.loads(dataset[0]["task"]) == trajectories[0].task  # "{}": the envs' tasks travel in messages
    assert main(["view", str(out)]) == 0
    assert (tmp_path / "rollouts.html").read_text().count("class='episode'") == 2


def test_eval_run_writes_its_results_as_parquet_with_config_and_summary(tmp_path):
    checkpoint = save_tiny_model(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    assert main(["eval", "forge_env/Arithmetic-v0", "--model", "tiny", "--local", str(checkpoint), "--device", "cpu",
                 "--n-tasks", "2", "--samples", "2", "--temperature", "1.0", "--max-tokens", "8",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    results = load_eval(out / RESULTS_FILE)
    assert results.summary == summary and results.config["env_id"] == "forge_env/Arithmetic-v0"
    assert sorted(t.episode_id for t in results.trajectories) == ["task0-s0", "task0-s1", "task1-s0", "task1-s1"]
    assert results.trajectories == sorted(read_trajectories(out / "episodes.jsonl"),
                                          key=lambda t: (t.group_id, t.episode_id))
    rescored = summarize(from_dataset(results.to_dataset()), samples=2)
    assert {k: rescored[k] for k in ("mean_reward", "pass@1", "pass@2", "episodes")} == \
        {k: summary[k] for k in ("mean_reward", "pass@1", "pass@2", "episodes")}
    # A run directory from before the Parquet file existed still loads.
    (out / RESULTS_FILE).unlink()
    assert load_eval(out).summary == summary and len(load_eval(out).trajectories) == 4


def test_eval_parquet_round_trips_message_level_results(tmp_path):
    episodes = [message_level_trajectory()]
    summary = summarize(episodes, samples=1)
    write_eval_parquet(tmp_path / "r.parquet", episodes, {"api": "chat"}, summary)
    results = load_eval(tmp_path / "r.parquet")
    assert results.trajectories == episodes and results.config == {"api": "chat"} and results.summary == summary


async def test_exported_rollouts_become_sft_data(tmp_path):
    """Rejection sampling from a shared file: the rewarded episodes' messages render back to the tokens sampled."""
    good, renderer = await scripted_episode(HERMES_TURNS)
    assert good.tools and not good.drifted
    failed = message_level_trajectory()
    low = Trajectory.from_dict({**good.to_dict(), "episode_id": "low", "reward": 0.0})
    write_parquet([good, failed, low], tmp_path / "rollouts.parquet")

    dataset = datasets.Dataset.from_parquet(str(tmp_path / "rollouts.parquet"), cache_dir=str(tmp_path / "cache"))
    demos = trajectory_demonstrations(from_dataset(dataset), min_reward=1.0)
    assert len(demos) == 1 and demos[0]["messages"] == good.messages and demos[0]["tools"] == good.tools
    assert len(trajectory_demonstrations(from_dataset(dataset))) == 2  # errors are never demonstrations
    [sample] = demonstration_samples(demos, renderer)
    # SFT trains exactly the tokens the policy sampled, at the positions it sampled them.
    assert sample.token_ids[: len(good.token_ids)] == good.token_ids
    trained = [token for token, bit in zip(sample.token_ids, sample.loss_mask, strict=True) if bit]
    assert trained == [token for turn in range(len(good.turns)) for token in good.sampled_ids(turn)]
