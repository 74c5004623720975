"""verifiers environments played as forge-env TextEnvs (``forge_env.make("verifiers:<taskset-id>")``).

The tasksets are written here with verifiers' own classes (``vf.Taskset``, ``vf.TaskData``, ``@vf.reward``,
``@vf.metric``, ``@vf.stop``, ``vf.Toolset`` with ``@vf.tool`` and a ``vf.State``) as installed packages (a
directory on ``sys.path``, which is all verifiers' loader asks of an installed environment). Every reward is
checked against what verifiers computes itself: a ``vf.Trace`` built here from verifiers' own message types
through verifiers' recording calls, scored by ``Task.score``, and against the number worked out by hand.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import forge_env
from agents.rollout import run_episode
from forge_env.chat import ChatRenderer
from forge_env.generation.base import Completion
from forge_env.models import build_byte_tokenizer
from forge_env.tools import format_hermes_call

# `make install` installs verifiers (Makefile): a missing one is a broken install, so this module fails
# loudly instead of skipping (fail closed).
try:
    import verifiers.v1 as vf
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(f"verifiers 0.4 is not installed ({exc}); `make install` installs it (docs/ecosystem.md)") from exc

SINGLE_TURN = '''
import verifiers.v1 as vf


class CapitalData(vf.TaskData):
    answer: str


class CapitalTask(vf.Task[CapitalData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply.strip().lower() == task.answer.lower())

    @vf.reward(weight=0.25)
    async def brief(self, trace) -> float:
        return float(len(trace.last_reply) <= 20)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))

    @vf.metric
    async def model_turns(self, trace) -> float:
        return float(trace.num_turns)


class CapitalConfig(vf.TasksetConfig):
    countries: list[str] = ["France", "Italy", "Spain"]


CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid"}


class Capitals(vf.Taskset[CapitalTask, CapitalConfig]):
    def load(self):
        for country in self.config.countries:
            if country == "Spain":  # a prompt given as messages (a few-shot exchange), not as text
                prompt = [vf.UserMessage(content="Capital of Peru?"),
                          vf.AssistantMessage(content="", tool_calls=[
                              vf.ToolCall(id="p1", name="atlas", arguments='{"country": "Peru"}')]),
                          vf.ToolMessage(tool_call_id="p1", content="Lima", name="atlas"),
                          vf.AssistantMessage(content="Lima"), vf.UserMessage(content=f"Capital of {country}?")]
            else:
                prompt = f"Capital of {country}?"
            yield CapitalTask(CapitalData(id=country.lower(), prompt=prompt, system_prompt="Answer with one word.",
                                          answer=CAPITALS[country]))


__all__ = ["Capitals"]
'''

TOOLS = '''
import verifiers.v1 as vf

TABLE = {"alpha": 3, "beta": 4, "gamma": 12}


class LookupState(vf.State):
    lookups: list[str] = []


class Table(vf.Toolset[vf.ToolsetConfig, LookupState]):
    """Per-episode tool server (Task.toolsets): a table look-up that remembers what was asked."""

    @vf.tool
    async def lookup(self, key: str) -> str:
        """Look a key up in the table."""
        self.state.lookups = [*self.state.lookups, key]
        if key not in TABLE:
            raise ValueError(f"no key {key!r}")
        return str(TABLE[key])


class Calc(vf.Toolset[vf.ToolsetConfig, vf.State]):
    """Taskset-wide tool server (Taskset.toolsets), advertised without a prefix."""

    TOOL_PREFIX = None

    def __init__(self, config):
        super().__init__(config)
        self.setups = 0

    async def setup(self):
        self.setups += 1

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


class SumData(vf.TaskData):
    keys: list[str]
    answer: int


class SumTask(vf.Task[SumData, LookupState, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply == str(task.answer))

    @vf.reward(weight=0.5)
    async def looked_everything_up(self, task, trace) -> float:
        return float(set(task.keys) <= set(trace.state.lookups))

    @vf.metric
    async def tool_results(self, trace) -> float:
        return float(len(trace.tool_messages))

    @vf.stop
    def asked_too_often(self, trace: vf.Trace) -> bool:
        return len(trace.state.lookups) >= 4

    @classmethod
    def toolsets(cls, config):
        return [Table(vf.ToolsetConfig())]


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        yield SumTask(SumData(prompt="Multiply the values of alpha and beta.", keys=["alpha", "beta"], answer=12))
        yield SumTask(SumData(prompt="What is the value of gamma?", keys=["gamma"], answer=12))

    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]


__all__ = ["SumTaskset"]
'''

NEEDS_RUNTIME = '''
import verifiers.v1 as vf


class BoxTask(vf.Task):
    @vf.reward
    async def passed(self, trace, runtime) -> float:
        return 1.0


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="run the tests"))


__all__ = ["BoxTaskset"]
'''

REWRITER = '''
import verifiers.v1 as vf


class Polite(vf.Task):
    @vf.intercept
    def add_please(self, request: vf.Request) -> vf.Request:
        return request


class PoliteTaskset(vf.Taskset[Polite, vf.TasksetConfig]):
    def load(self):
        yield Polite(vf.TaskData(prompt="hello"))


__all__ = ["PoliteTaskset"]
'''


OLD_API = '''
def load_environment(**kwargs):  # how a verifiers 0.3 environment package looks (it would return a vf.Environment)
    raise AssertionError("never called")
'''

TWO_AGENTS = '''
import verifiers.v1 as vf


class Debate(vf.Env[vf.EnvConfig]):
    async def run(self, task, agents):
        raise AssertionError("never called")


class Topics(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="argue"))


__all__ = ["Debate", "Topics"]
'''

ENDLESS = '''
import itertools

import verifiers.v1 as vf


class Double(vf.Task):
    @vf.reward
    async def doubled(self, task, trace) -> float:
        return float(float(trace.last_reply) == 2 * task.idx)  # raises on a reply that is not a number


class Doubles(vf.Taskset[Double, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        for n in itertools.count():
            yield Double(vf.TaskData(prompt=f"Double {n}."))


__all__ = ["Doubles"]
'''

SILENT = '''
import verifiers.v1 as vf


class UserOpens(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt=None, system_prompt="Wait for the user."))


__all__ = ["UserOpens"]
'''

PACKAGES = {"vf_capitals": SINGLE_TURN, "vf_lookup": TOOLS, "vf_box": NEEDS_RUNTIME, "vf_empty": "__all__ = []\n",
            "vf_old": OLD_API, "vf_debate": TWO_AGENTS, "vf_polite": REWRITER,
            "vf_endless": ENDLESS, "vf_silent": SILENT}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The tasksets above as installed packages (verifiers imports an environment by its package name)."""
    for name, source in PACKAGES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


async def verifiers_reward(task, messages, tools=(), state=None, prompt=0):
    """What verifiers computes for ``messages`` (verifiers' own message types; the first ``prompt`` of them the
    task's prompt): the trace its interception server records (one ``prepare_turn(...).commit(response)`` per
    model reply), scored by ``Task.score``."""
    from verifiers.v1 import graph
    from verifiers.v1.state import state_cls

    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     state=state if state is not None else state_cls(type(task))(),
                     agent=vf.AgentInfo(config=vf.AgentConfig()))
    for i, message in enumerate(messages):
        if i >= prompt and isinstance(message, vf.AssistantMessage):
            response = vf.Response(id=str(i), created=0, model="m", message=message,
                                   finish_reason="tool_calls" if message.tool_calls else "stop")
            graph.prepare_turn(trace, messages[:i], list(tools)).commit(response)
    await task.score(trace)
    return trace.reward, trace


def tasks_of(taskset_cls, **config):
    config_cls = vf.taskset_config_type(taskset_cls.__module__)
    return list(taskset_cls(config_cls(**config)))


# ----------------------------------------------------------------------------- single turn, with a rubric

async def test_single_turn_rewards_are_what_verifiers_computes(installed):
    from vf_capitals import Capitals

    env = forge_env.make("verifiers:vf-capitals", max_turns=2)
    assert [t["task_id"] for t in env.tasks] == ["vf-capitals/france", "vf-capitals/italy", "vf-capitals/spain"]
    vf_tasks = tasks_of(Capitals)
    cases = [(0, "Paris", 1.25), (1, "rome", 1.25), (1, "It is Milan, I believe, or maybe Rome", 0.0),
             (2, "Madrid", 1.25), (2, "The capital of Spain is Madrid.", 0.0)]
    for index, reply, by_hand in cases:
        observation, info = await env.areset(options={"task": env.tasks[index]})
        assert observation[0] == {"role": "system", "content": "Answer with one word."}
        assert info["tools"] == [] and info["task_id"] == env.tasks[index]["task_id"]
        _, reward, terminated, truncated, step_info = await env.astep({"role": "assistant", "content": reply})
        assert terminated and not truncated
        data = vf_tasks[index].data
        prompt = [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
        opening = [vf.SystemMessage(content=data.system_prompt), *prompt]
        expected, trace = await verifiers_reward(vf_tasks[index], [*opening, vf.AssistantMessage(content=reply)],
                                                 prompt=len(opening))
        assert reward == pytest.approx(expected) == pytest.approx(by_hand), (index, reply)
        assert step_info["metrics"]["reply_chars"] == len(reply) == trace.metrics["reply_chars"]
        assert step_info["metrics"]["reward/exact"] == trace.rewards["exact"].score
        assert step_info["metrics"]["model_turns"] == trace.num_turns == 1  # a few-shot reply is not a model turn
    assert env.state.messages[1:6] == [
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "p1", "type": "function", "function": {"name": "atlas", "arguments": '{"country": "Peru"}'}}]},
        {"role": "tool", "content": "Lima", "tool_call_id": "p1", "name": "atlas"},
        {"role": "assistant", "content": "Lima"}, {"role": "user", "content": "Capital of Spain?"}]


async def test_taskset_arguments_reach_its_config_and_rows_round_trip(installed):
    env = forge_env.make("verifiers:vf-capitals", countries=["Italy"])
    assert [t["answer"] for t in env.tasks] == ["Rome"]
    row = json.loads(json.dumps(env.tasks[0]))  # a task row survives JSON (datasets, --out files)
    await env.areset(options={"task": row})
    assert (await env.astep("Rome"))[1] == pytest.approx(1.25)
    with pytest.raises(forge_env.TaskError, match="not a row of verifiers taskset"):
        await env.areset(options={"task": {"prompt": "no answer field"}})


def test_check_env_passes_on_both_tasksets(installed):
    forge_env.check_env(lambda: forge_env.make("verifiers:vf-capitals"))
    forge_env.check_env(lambda: forge_env.make("verifiers:vf-lookup", max_turns=3))
    forge_env.check_env(forge_env.make("verifiers:vf-lookup"))  # an instance: check_env deep-copies it


async def test_an_infinite_taskset_needs_a_limit_and_a_reward_that_raises_scores_zero(installed):
    with pytest.raises(ValueError, match="Doubles is infinite: pass limit="):
        forge_env.make("verifiers:vf-endless")
    env = forge_env.make("verifiers:vf-endless", limit=3)
    assert [t["prompt"] for t in env.tasks] == ["Double 0.", "Double 1.", "Double 2."]
    await env.areset(options={"task": env.tasks[2]})
    assert (await env.astep("4"))[1] == 1.0
    await env.areset(options={"task": env.tasks[2]})
    _, reward, terminated, _, info = await env.astep("four")  # the env cannot grade it: 0, never an exception
    assert terminated and reward == 0.0 and info["metrics"] == {"scoring_error": 1.0}
    assert env.state.data["trace"].errors[0].type == "TaskError"


# ----------------------------------------------------------------------------- tools, state, multi-turn

async def test_tool_env_plays_several_turns_and_scores_with_tool_state(installed):
    from vf_lookup import SumTaskset

    env = forge_env.make("verifiers:vf-lookup", max_turns=5)
    observation, info = await env.areset(options={"task": env.tasks[0]})
    advertised = info["tools"]
    assert sorted(t["function"]["name"] for t in advertised) == ["multiply", "table_lookup"]
    lookup_spec = next(t["function"] for t in info["tools"] if t["function"]["name"] == "table_lookup")
    assert lookup_spec["description"] == "Look a key up in the table."
    assert lookup_spec["parameters"]["required"] == ["key"]

    turn1 = {"role": "assistant", "content": "",
             "tool_calls": [call("table_lookup", {"key": "alpha"}, "c1"), call("table_lookup", {"key": "beta"}, "c2")]}
    obs, reward, terminated, truncated, _ = await env.astep(turn1)
    assert [m["content"] for m in obs] == ["3", "4"] and reward == 0 and not (terminated or truncated)
    turn2 = {"role": "assistant", "content": "", "tool_calls": [call("multiply", {"a": 3, "b": 4}, "c3")]}
    obs, *_ = await env.astep(turn2)
    assert obs[0]["content"] == "12"
    obs, reward, terminated, truncated, info = await env.astep({"role": "assistant", "content": "12"})
    assert terminated and not truncated
    assert info["metrics"]["tool_results"] == 3 and info["metrics"]["reward/looked_everything_up"] == 1.0

    task = tasks_of(SumTaskset)[0]
    specs = [vf.Tool(**t["function"]) for t in advertised]
    vf_turn1 = vf.AssistantMessage(content="", tool_calls=[
        vf.ToolCall(id="c1", name="table_lookup", arguments='{"key": "alpha"}'),
        vf.ToolCall(id="c2", name="table_lookup", arguments='{"key": "beta"}')])
    vf_turn2 = vf.AssistantMessage(content="", tool_calls=[
        vf.ToolCall(id="c3", name="multiply", arguments='{"a": 3, "b": 4}')])
    messages = [vf.UserMessage(content=task.data.prompt), vf_turn1,
                vf.ToolMessage(tool_call_id="c1", content="3", name="table_lookup"),
                vf.ToolMessage(tool_call_id="c2", content="4", name="table_lookup"), vf_turn2,
                vf.ToolMessage(tool_call_id="c3", content="12", name="multiply"), vf.AssistantMessage(content="12")]
    from vf_lookup import LookupState

    expected, _ = await verifiers_reward(task, messages, specs, LookupState(lookups=["alpha", "beta"]), prompt=1)
    assert reward == pytest.approx(expected) == pytest.approx(1.5)


async def test_bad_tool_calls_are_error_observations_and_state_is_per_episode(installed):
    env = forge_env.make("verifiers:vf-lookup", max_turns=6)
    await env.areset(options={"task": env.tasks[1]})
    bad = {"role": "assistant", "content": "", "tool_calls": [
        call("table_lookup", {"kee": "gamma"}, "c1"),  # wrong argument name
        call("table_lookup", {"key": "delta"}, "c2"),  # the tool raises
        call("multiply", {"a": "x", "b": 2}, "c3")]}
    obs, reward, terminated, truncated, info = await env.astep(bad)
    assert not (terminated or truncated) and len(obs) == 3
    assert all(m["content"].startswith("Error") for m in obs), obs
    # as over verifiers' MCP server: a crashing tool's text stays on the server, the model reads only that it failed
    assert obs[1]["content"] == "Error: Error executing tool lookup"
    assert "unknown argument(s) ['kee']" in obs[0]["content"] and "expected integer" in obs[2]["content"]
    assert env.state.data["shared_state"].state.lookups == []  # verifiers pushes state only after a call returns
    obs, *_ = await env.astep({"role": "assistant", "content": "",
                               "tool_calls": [call("table_lookup", {"key": "gamma"}, "c4")]})
    assert obs[0]["content"] == "12"
    _, reward, terminated, _, _ = await env.astep("12")
    assert terminated and reward == pytest.approx(1.5)
    await env.areset(options={"task": env.tasks[1]})  # a new episode starts with a fresh tool state
    assert env.state.data["shared_state"].state.lookups == []
    _, reward, *_ = await env.astep("12")
    assert reward == pytest.approx(1.0)
    assert env._shared_servers[0].setups == 1  # the taskset-wide server is set up once, not per episode


async def test_a_stop_hook_ends_the_episode_and_a_cut_short_episode_is_scored(installed):
    env = forge_env.make("verifiers:vf-lookup", max_turns=6)
    await env.areset(options={"task": env.tasks[1]})
    four = {"role": "assistant", "content": "",
            "tool_calls": [call("table_lookup", {"key": k}, f"c{i}") for i, k in enumerate(["gamma"] * 4)]}
    _, reward, terminated, truncated, info = await env.astep(four)
    assert terminated and not truncated and info["stop_condition"] == "asked_too_often"
    assert reward == pytest.approx(0.5)  # looked everything up, gave no answer: verifiers scores it anyway
    with pytest.raises(forge_env.EpisodeEndedError):
        await env.astep("12")

    env = forge_env.make("verifiers:vf-lookup", max_turns=1)
    await env.areset(options={"task": env.tasks[1]})
    _, reward, terminated, truncated, info = await env.astep(
        {"role": "assistant", "content": "", "tool_calls": [call("table_lookup", {"key": "gamma"}, "c1")]})
    assert truncated and not terminated and info["truncation_reason"] == "max_turns"
    assert reward == pytest.approx(0.5) == info["episode_summary"]["return"]


# ----------------------------------------------------------------------------- through forge-env's rollout

class ScriptedPolicy:
    """The policy's turns as text (a model's completions), tokenized with the byte tokenizer."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)

    async def generate(self, prompt_ids, sampling, session_id=None):
        ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[-0.5] * len(ids), text="",
                          finish_reason="stop", policy_version=0)

    async def release_session(self, session_id):
        pass


async def test_rollout_plays_a_verifiers_tool_env_token_exactly(installed):
    tokenizer = build_byte_tokenizer()
    env = forge_env.make("verifiers:vf-lookup", max_turns=4)
    turns = [format_hermes_call("table_lookup", {"key": "alpha"}) + format_hermes_call("table_lookup", {"key": "beta"})
             + "<|im_end|>",
             format_hermes_call("multiply", {"a": 3, "b": 4}) + "<|im_end|>",
             "12<|im_end|>"]
    trajectory = await run_episode(env, ScriptedPolicy(tokenizer, turns), ChatRenderer(tokenizer),
                                   task=env.tasks[0], env_id="verifiers:vf-lookup")
    assert trajectory.ok, trajectory.error
    trajectory.check()
    assert not trajectory.drift  # the episode's tokens are what the chat template renders
    assert len(trajectory.turns) == 3 and trajectory.reward == pytest.approx(1.5)
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["3", "4", "12"]


# ----------------------------------------------------------------------------- what does not load, and why

def test_bad_ids_arguments_and_unmappable_tasksets_get_clear_errors(installed):
    from environments.verifiers_env import VerifiersEnvError

    with pytest.raises(VerifiersEnvError, match="no verifiers environment 'no-such-env' is installed"):
        forge_env.make("verifiers:no-such-env")
    with pytest.raises(forge_env.UnknownEnvironmentError, match="write verifiers:<name>"):
        forge_env.make("verifiers:")
    with pytest.raises(forge_env.UnknownEnvironmentError, match="verifiers:<name>"):
        forge_env.make("verifier:vf-capitals")  # a misspelt namespace lists the namespaces
    with pytest.raises(VerifiersEnvError, match="(?s)bad arguments .*vf-capitals.*countres"):
        forge_env.make("verifiers:vf-capitals", countres=["Italy"])
    with pytest.raises(VerifiersEnvError, match="exports no Taskset subclass"):
        forge_env.make("verifiers:vf-empty")
    with pytest.raises(VerifiersEnvError, match=r"need a runtime .*\['passed'\]"):
        forge_env.make("verifiers:vf-box")
    with pytest.raises(VerifiersEnvError, match="(?s)defines no `__all__`.*load_environment.*verifiers 0.3 API"):
        forge_env.make("verifiers:vf-old")
    with pytest.raises(VerifiersEnvError, match="exports its own vf.Env \\(Debate\\), which drives several agents"):
        forge_env.make("verifiers:vf-debate")
    with pytest.raises(VerifiersEnvError, match=r"@vf.intercept hooks \['add_please'\]"):
        forge_env.make("verifiers:vf-polite")
    with pytest.raises(VerifiersEnvError, match=r"tasks \[0\] have no prompt; the user opens"):
        forge_env.make("verifiers:vf-silent")


def test_a_missing_or_old_verifiers_is_named_with_the_install_step(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    from environments.verifiers_env import VerifiersUnavailableError, loading

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(loading, "version", missing)
    with pytest.raises(VerifiersUnavailableError, match="not installed.*make install"):
        forge_env.make("verifiers:vf-capitals")
    monkeypatch.setattr(loading, "version", lambda name: "0.3.1")
    with pytest.raises(VerifiersUnavailableError, match="0.3.1 is installed, but the adapter speaks .*0.4"):
        forge_env.make("verifiers:vf-capitals")
