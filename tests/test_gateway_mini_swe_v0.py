"""mini-swe-agent on SWE-v0 through the gateway: its commands run in the episode's workspace through
``agents.gateway.mini_swe.GatewayEnvironment`` (loaded by mini-swe-agent's own config file), and SWE-v0 grades.

1. mini-swe-agent, unmodified, with ``examples/mini_swe_agent/swe_v0.yaml``, against the tiny model on a bundled
   task: the nonsense it writes ends by the step limit, the trajectory passes the token checks, SWE-v0 grades the
   untouched workspace (reward 0) and the workspace's sandbox session is gone afterwards.
2. The same environment class driven directly (no model) applies the task's reference patch with its commands:
   SWE-v0's grading pays 1, so the reward path can pay.
"""

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from agents.gateway import HISTORY_EDITED, AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer, GatewayServeSettings
from environments.swe import SWEEnv
from environments.swe.bundled import bundled_tasks
from forge_env.chat import ChatRenderer
from forge_env.chat_drift import CONTROL_TOKEN
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model
from tests.sandbox_support import requires_bwrap
from tests.serve_support import alive
from tests.swe_support import swe_sandbox

ROOT = Path(__file__).resolve().parent.parent
MINI = shutil.which("mini", path=str(Path(sys.executable).parent))
if MINI is None:  # the dev extra ships it: missing, this module fails, not a skip
    raise ImportError("mini-swe-agent's `mini` is not beside this interpreter (pip install -e '.[dev]')")
CONFIG = ROOT / "examples" / "mini_swe_agent" / "swe_v0.yaml"
TOKEN = "mini-swe-token"
STEPS = 2
pytestmark = [requires_bwrap, pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")]


@pytest.fixture(scope="module")
def sandbox():
    yield from swe_sandbox("process")


@pytest.fixture(scope="module")
def bundled():
    rows, repos = bundled_tasks()
    return rows[0], repos


def swe_env(bundled, sandbox):
    row, repos = bundled
    return SWEEnv([row], repos_dir=repos, sandbox=sandbox, bash_timeout=20, grading_timeout=120, spare_sessions=0)


def workspace_session(env):
    session = env.state.data["workspace"]._session
    assert session is not None and session._worker is not None and session._worker.pids
    return session, list(session._worker.pids)


def assert_removed(workspace, sandbox):
    """The workspace's sandbox session is closed: its worker processes (and the tmpfs they held) are gone."""
    session, pids = workspace
    assert session._closed and session._worker is None and session not in sandbox._sessions
    assert not any(alive(pid) for pid in pids), pids


async def test_mini_swe_agent_on_a_swe_v0_task_is_graded_by_swe_v0_and_its_workspace_removed(tmp_path, bundled,
                                                                                                sandbox):
    row, _ = bundled
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=2))
    gateway = AgentGateway(generator, ChatRenderer(tokenizer),
                           GatewayConfig(default_sampling=SamplingParams(temperature=1.0, max_tokens=24)))
    env = swe_env(bundled, sandbox)
    process_env = {**os.environ, "MSWEA_CONFIGURED": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                   "HOME": str(tmp_path), "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"), "NO_COLOR": "1",
                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        async with GatewayServer(gateway, GatewayServeSettings(token=TOKEN)) as server:
            episode = gateway.open_episode(task_id=row["instance_id"])
            await gateway.envs.attach(episode, env, options={"task": row})
            workspace = workspace_session(env)
            url = server.episode_url(episode)
            process = await asyncio.create_subprocess_exec(
                MINI, "-t", row["problem_statement"], "-o", str(tmp_path / "traj.json"),
                "-c", "mini.yaml", "-c", str(CONFIG), "-c", f"model.model_kwargs.api_base={url}",
                "-c", f"environment.base_url={url}", "-c", f"model.model_kwargs.api_key={TOKEN}",
                "-c", f"environment.api_key={TOKEN}", "-c", "model.model_kwargs.max_tokens=24",
                "-c", f"agent.step_limit={STEPS}", "-c", "agent.max_consecutive_format_errors=0",
                cwd=tmp_path, env=process_env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
            output = (await process.communicate())[0].decode(errors="replace")
            assert process.returncode == 0, output[-3000:]
            record = json.loads((tmp_path / "traj.json").read_text())
            assert record["info"]["exit_status"] == "LimitsExceeded", record["info"]
            assert record["info"]["config"]["environment_type"] == "agents.gateway.mini_swe.GatewayEnvironment"
            assert "api_key" not in record["info"]["config"]["environment"]
            trajectory = await gateway.finish(episode, reward=0.0)
            outcome = await gateway.envs.finish(episode)
        trajectory.check()
        assert len(trajectory.turns) == STEPS and len(trajectory.segment_starts) == STEPS
        assert {d["kind"] for d in trajectory.drift} <= {HISTORY_EDITED, CONTROL_TOKEN}
        samples = trajectory.to_samples()
        assert sum(sum(s.loss_mask) for s in samples) == trajectory.num_sampled_tokens
        # SWE-v0 graded the untouched workspace: its failing tests still fail
        assert outcome.graded and outcome.reward == 0.0 and outcome.infra_error is None
        assert outcome.summary["resolved"] is False
        assert outcome.summary["fail_to_pass"] == f"0/{len(row['FAIL_TO_PASS'])}"
        assert_removed(workspace, sandbox)
        assert episode not in gateway.envs
    finally:
        await gateway.aclose()
        await generator.aclose()


async def test_the_environment_class_applying_the_reference_patch_earns_reward_one(bundled, sandbox):
    from minisweagent.exceptions import Submitted

    from agents.gateway.mini_swe import GatewayEnvironment

    row, _ = bundled
    gateway = AgentGateway(generator=None, renderer=None)  # no model: the environment class alone
    env = swe_env(bundled, sandbox)
    try:
        async with GatewayServer(gateway, GatewayServeSettings(token=TOKEN)) as server:
            episode = gateway.open_episode()
            await gateway.envs.attach(episode, env, options={"task": row})
            workspace = workspace_session(env)
            shell = GatewayEnvironment(base_url=server.episode_url(episode), api_key=TOKEN,
                                       env={"PAGER": "cat"})

            def run(command: str, cwd: str = "") -> dict:
                return shell.execute({"command": command}, cwd)

            failed = await asyncio.to_thread(run, "git status --short; exit 3")
            assert failed["returncode"] == 3 and failed["output"] == ""
            where = await asyncio.to_thread(run, "pwd; echo $PAGER", "tests")
            assert where["returncode"] == 0 and where["output"].splitlines()[0].endswith("/repo/tests")
            assert where["output"].splitlines()[1] == "cat"
            applied = await asyncio.to_thread(run, f"git apply - <<'EOF'\n{row['patch']}EOF\ngit diff --stat")
            assert applied["returncode"] == 0 and "1 file changed" in applied["output"], applied
            with pytest.raises(Submitted):
                await asyncio.to_thread(run, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
            # the route refuses a tool the environment lacks; a bad argument is the tool's error observation
            tools = server.base_url + f"/e/{episode}/env/tools/"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(timeout=60) as http:
                missing = await http.post(tools + "rm", json={"path": "."}, headers=auth)
                assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_tool"
                wrong = (await http.post(tools + "bash", json={"cmd": "ls"}, headers=auth)).json()
                assert wrong["error"] is True and wrong["done"] is False
                task = (await http.get(server.base_url + f"/e/{episode}/env", headers=auth)).json()
                assert row["problem_statement"].strip() in task["messages"][-1]["content"]
                assert {t["function"]["name"] for t in task["tools"]} >= {"bash", "submit"}
            # a wrong token never reaches the workspace
            stranger = GatewayEnvironment(base_url=server.episode_url(episode), api_key="wrong")
            refused = await asyncio.to_thread(stranger.execute, {"command": "rm -rf ."})
            assert refused["returncode"] == -1 and "401" in refused["exception_info"]
            outcome = await gateway.envs.finish(episode)
            # after the episode, its tools answer 409/404 and the class reports it (no command runs)
            gone = await asyncio.to_thread(run, "ls")
            assert gone["returncode"] == -1 and "404" in gone["exception_info"]
        assert outcome.graded and outcome.reward == 1.0, outcome.summary
        assert outcome.summary["resolved"] is True and outcome.summary["dropped"] == {}
        assert_removed(workspace, sandbox)
    finally:
        await gateway.aclose()
