"""forge-env serve with openenv-core's own GenericEnvClient, and OpenEnvTextEnv over forge and plain OpenEnv servers.

Every server here is a real process: ``forge-env serve`` with Monarch replicas (or the local backend where
only the web layer is under test), and a plain openenv-core MCP environment served by openenv-core itself.
"""

import asyncio
import json
import os
import signal
import sys

import httpx
import pytest
import websockets
from openenv.core.generic_client import GenericEnvClient

import forge_env
from forge_env.openenv import OpenEnvError, OpenEnvTextEnv
from forge_env.tools import format_hermes_call
from forge_env.types import assistant_message
from tests.serve_support import ServerProcess, alive, descendants
from tests.waiting import wait_until

TOOL_USE = "forge_env/ToolUse-v0"
CODING = "forge_env/Coding-v0"
STEP_TIMEOUT = 60


@pytest.fixture(scope="module")
def tool_use_server():
    server = ServerProcess.forge(TOOL_USE, "--replicas", "2")
    yield server
    assert server.stop() == 0


async def expert_episode(env_id, seed, wrong_final=False, **kwargs):
    """Play the env's expert in-process; returns the actions taken and what each step returned."""
    env = forge_env.make(env_id, **kwargs)
    await env.areset(seed=seed)
    actions, results, wrong_left = [], [], wrong_final
    while True:
        action = env.expert_action()
        if wrong_left and not action.get("tool_calls"):
            action, wrong_left = assistant_message("Answer: -1\n```python\ndef nothing(): pass\n```"), False
        actions.append(action)
        observation, reward, terminated, truncated, _ = await env.astep(action)
        results.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            await env.aclose()
            return actions, results


async def replay(url, seed, actions):
    """The same actions through the real OpenEnv client; returns what each step returned."""
    async with GenericEnvClient(base_url=url, message_timeout_s=STEP_TIMEOUT) as client:
        await client.reset(seed=seed)
        results = []
        for action in actions:
            step = await client.step(action)
            observation = step.observation
            assert step.done == (observation["terminated"] or observation["truncated"])
            results.append((observation["messages"], step.reward, observation["terminated"], observation["truncated"]))
        return results


async def test_generic_client_plays_tool_use_with_in_process_rewards(tool_use_server):
    url = tool_use_server.url
    for seed in range(4):
        actions, local = await expert_episode(TOOL_USE, seed, wrong_final=seed % 2 == 1)
        assert await replay(url, seed, actions) == local
        assert local[-1][1] == (0.0 if seed % 2 else 1.0)

    async with GenericEnvClient(base_url=url) as client:
        reset = await client.reset(seed=0)
        assert reset.reward is None and not reset.done
        assert [m["role"] for m in reset.observation["messages"]] == ["system", "user"]
        assert reset.observation["tools"][0]["function"]["name"] == "search"
        raw = await client.step({"content": format_hermes_call("search", {"query": "population"})})
        assert raw.observation["messages"][0]["role"] == "tool"  # a raw reply is parsed like a string action
        bad = await client.step({"content": 3})  # a bad action is an observation, not an error frame
        assert "invalid action" in bad.observation["messages"][0]["content"] and not bad.done
        tools = await client.step({"type": "list_tools"})
        assert {t["name"] for t in tools.observation["tools"]} >= {"search", "read"}
        state = await client.state()
        assert state["step_count"] == 2 and state["env_id"] == TOOL_USE
        with pytest.raises(RuntimeError, match="code: UNKNOWN_TYPE"):
            await client._send_and_receive({"type": "dance"})

    described = {path: httpx.get(url + path).json() for path in ("/health", "/metadata", "/schema")}
    assert described["/health"] == {"status": "healthy"}
    assert described["/metadata"]["name"] == TOOL_USE
    assert set(described["/schema"]) == {"action", "observation", "state"}
    stateless = httpx.post(url + "/step", json={"seed": 1, "action": {"content": "Answer: 7"}}).json()
    assert stateless["done"] is True and stateless["observation"]["terminated"] is True
    assert httpx.post(url + "/step", json={"seed": 1}).status_code == 422
    assert httpx.post(url + "/reset", json={"seed": -1}).json()["code"] == "VALIDATION_ERROR"


async def test_64_concurrent_sessions(tool_use_server):
    episodes = [await expert_episode(TOOL_USE, seed) for seed in range(64)]
    results = await asyncio.wait_for(asyncio.gather(
        *(replay(tool_use_server.url, seed, actions) for seed, (actions, _) in enumerate(episodes))), 240)
    assert results == [local for _, local in episodes]
    assert [result[-1][1] for result in results] == [1.0] * 64
    stats = httpx.get(tool_use_server.url + "/stats").json()
    assert all(replica["episodes_started"] >= 8 for replica in stats["replicas"]), stats  # both replicas served


async def test_round_trip_check_env_and_rollout_loop(tool_use_server):
    from agents.groups import GroupRequest, rollout_group
    from agents.rollout import EpisodeBudget
    from forge_env.chat import ChatRenderer
    from forge_env.generation.base import SamplingParams
    from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
    from forge_env.models import build_byte_tokenizer, build_tiny_model

    url = tool_use_server.url
    await asyncio.to_thread(forge_env.check_env, lambda: OpenEnvTextEnv(url))

    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=4))
    renderer = ChatRenderer(tokenizer)
    sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=5,
                              stop_token_ids=tuple(range(ord("a"), ord("z") + 1)))
    try:
        runs = []
        for make_env in (lambda: forge_env.make(TOOL_USE), lambda: OpenEnvTextEnv(url)):
            runs.append(await rollout_group(make_env, generator, renderer, GroupRequest(seed=2, n=2),
                                            sampling=sampling, budget=EpisodeBudget(max_turns=3)))
    finally:
        generator.close()
    for local, remote in zip(*runs, strict=True):
        assert remote.ok, remote.error
        assert (remote.token_ids, remote.reward, remote.messages) == (local.token_ids, local.reward, local.messages)
        remote.check()  # token-exact: loss mask, logprobs aligned
        assert len(remote.turns) == len(local.turns)


async def test_replica_killed_mid_episode_is_resumed_on_another(tool_use_server):
    """ToolUse-v0 episodes snapshot: a killed replica's sessions go on, on the other replica, from their last
    turn; the step's info records the resume and /stats counts it."""
    url = tool_use_server.url
    clients = [GenericEnvClient(base_url=url, message_timeout_s=STEP_TIMEOUT) for _ in range(6)]
    for seed, client in enumerate(clients):
        await client.connect()
        await client.reset(seed=seed)
    stats = httpx.get(url + "/stats").json()
    victim = max(stats["replicas"], key=lambda replica: replica["open_episodes"])
    os.kill(victim["pid"], signal.SIGKILL)
    records = []
    for client in clients:
        step = await client.step({"content": "Answer: 0"})
        assert step.done and step.observation["info"]["episode_summary"]["turns"] == 1
        records.append(step.observation["info"].get("resumed"))
    resumed = [record for record in records if record is not None]
    assert len(resumed) == victim["open_episodes"] > 0 and all(record["from_turn"] == 0 for record in resumed)
    assert httpx.get(url + "/stats").json()["sessions_resumed"] - stats["sessions_resumed"] == len(resumed)
    for client in clients:
        await client.close()


async def test_replica_killed_mid_episode_without_resume():
    """``--no-resume`` (and any environment that cannot snapshot): the killed replica's sessions are lost."""
    server = ServerProcess.forge(TOOL_USE, "--replicas", "2", "--no-resume")
    try:
        await _lose_a_replica(server.url)
    finally:
        assert server.stop() == 0


async def _lose_a_replica(url):
    clients = [GenericEnvClient(base_url=url, message_timeout_s=STEP_TIMEOUT) for _ in range(6)]
    for seed, client in enumerate(clients):
        await client.connect()
        await client.reset(seed=seed)
    replicas = httpx.get(url + "/stats").json()["replicas"]
    victim = max(replicas, key=lambda replica: replica["open_episodes"])
    os.kill(victim["pid"], signal.SIGKILL)
    outcomes = []
    for client in clients:
        try:
            await client.step({"content": "Answer: 0"})
            outcomes.append("ok")
        except RuntimeError as error:
            assert "code: SESSION_LOST" in str(error)
            outcomes.append("lost")
    assert outcomes.count("lost") == victim["open_episodes"] and "ok" in outcomes, outcomes
    lost = clients[outcomes.index("lost")]
    assert not (await lost.reset(seed=9)).done  # the same connection starts over on a live replica
    assert (await lost.step({"content": "Answer: 0"})).done
    async with GenericEnvClient(base_url=url) as fresh:  # and new sessions are served
        await fresh.reset(seed=1)
        assert (await fresh.step({"content": "Answer: 0"})).done
    for client in clients:
        await client.close()


async def test_coding_rewards_and_clean_sigterm_shutdown():
    server = ServerProcess.forge(CODING, "--replicas", "1")
    try:
        rewards = []
        for seed in range(3):  # seed 1: a failing program first (test feedback, a second attempt), then the fix
            actions, local = await expert_episode(CODING, seed, wrong_final=seed == 1)
            remote = await replay(server.url, seed, actions)
            assert [r[1:] for r in remote] == [r[1:] for r in local]
            assert [[m["role"] for m in r[0]] for r in remote] == [[m["role"] for m in r[0]] for r in local]
            rewards.append([r[1] for r in remote])
        assert rewards[0] == rewards[2] == [1.0] and len(rewards[1]) == 2 and rewards[1][0] == 0.0, rewards
        async with GenericEnvClient(base_url=server.url) as client:  # an open session when SIGTERM arrives
            await client.reset(seed=0)
            replica_pids = {r["pid"] for r in httpx.get(server.url + "/stats").json()["replicas"]}
            children = descendants(server.proc.pid) | replica_pids
            assert replica_pids and children
            assert server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    await wait_until(lambda: not any(alive(pid) for pid in children), timeout=30)


async def test_capacity_idle_ttl_token_and_frame_size():
    server = ServerProcess.forge(TOOL_USE, "--backend", "local", "--max-sessions", "2", "--idle-ttl", "4",
                                 "--token", "s3cret", "--max-frame-mb", "0.01")
    url, auth = server.url, {"Authorization": "Bearer s3cret"}
    try:
        assert httpx.get(url + "/health").status_code == 200  # health checks need no token
        assert httpx.get(url + "/metadata").status_code == 401
        assert httpx.get(url + "/metadata", headers=auth).status_code == 200
        with pytest.raises(OpenEnvError, match="CONNECTION_LOST"):
            await OpenEnvTextEnv(url, token="wrong").areset(seed=0)

        async with websockets.connect(url.replace("http", "ws") + "/ws", additional_headers=auth) as ws:
            await ws.send(json.dumps({"type": "step", "data": {"content": "x" * 20_000}}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd.code == 1009  # message too big

        held = [OpenEnvTextEnv(url, token="s3cret") for _ in range(2)]
        for env in held:
            await env.areset(seed=0)
        with pytest.raises(OpenEnvError) as full:
            await OpenEnvTextEnv(url, token="s3cret").areset(seed=0)
        assert full.value.code == "CAPACITY_REACHED" and full.value.data["max_sessions"] == 2

        await wait_until(lambda: httpx.get(url + "/stats", headers=auth).json()["active_sessions"] == 0, timeout=60)
        with pytest.raises(OpenEnvError) as expired:
            await held[0].astep("Answer: 1")
        assert expired.value.code == "SESSION_EXPIRED"
        await held[0].areset(seed=0)  # reconnects: a new session in the freed slot
        assert (await held[0].astep("Answer: 1"))[2] is True
        await held[0].aclose()
    finally:
        assert server.stop() == 0


async def test_openenv_text_env_over_a_plain_openenv_tool_server():
    server = ServerProcess([sys.executable, "-m", "tests.openenv_guess_server"])
    try:
        await asyncio.to_thread(forge_env.check_env, lambda: OpenEnvTextEnv(
            server.url, final_answer_tool="submit", answer_argument="guess"))
        env = OpenEnvTextEnv(server.url, final_answer_tool="submit", answer_argument="guess", max_turns=12)
        observation, info = await env.areset(seed=3)
        assert observation[0]["content"].startswith("Guess the number")
        assert [spec["function"]["name"] for spec in info["tools"]] == ["hint", "submit"]
        low, high = 1, 16
        while True:
            guess = (low + high) // 2
            observation, reward, terminated, _, _ = await env.astep(format_hermes_call("hint", {"guess": guess}))
            verdict = observation[0]["content"]
            assert observation[0]["role"] == "tool" and reward == 0.0 and not terminated
            if verdict == "correct":
                break
            low, high = (guess + 1, high) if verdict == "higher" else (low, guess - 1)
        bad = await env.astep(format_hermes_call("hint", {"guess": "many"}))
        assert bad[0][0]["content"].startswith("Error:") and not bad[2]  # checked against the listed schema
        _, reward, terminated, _, info = await env.astep(str(guess))  # the final answer goes to submit
        assert (reward, terminated, info["episode_summary"]["return"]) == (1.0, True, 1.0)
        await env.aclose()
    finally:
        server.stop()
