"""mini-swe-agent (the PyPI package, unmodified, configured by its own config options) against the gateway.

The tiny random model never writes a valid bash tool call, so mini-swe-agent answers every reply with a format
error, dropping the reply from its history: each call after the first is a history edit. The run must still end
by its step limit, and the episode's trajectory must hold every sampled turn verbatim with one segment per edit.
"""

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from agents.gateway import HISTORY_EDITED, AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer, GatewayServeSettings
from forge_env.chat import ChatRenderer
from forge_env.chat_drift import CONTROL_TOKEN
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model

MINI = shutil.which("mini", path=str(Path(sys.executable).parent))
if MINI is None:  # the dev extra ships it: missing, this module fails, not a skip
    raise ImportError("mini-swe-agent's `mini` is not beside this interpreter (pip install -e '.[dev]')")
pytestmark = [pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")]
STEPS = 3


def mini_command(base_url: str, token: str, output: Path) -> list[str]:
    return [MINI, "-y", "--exit-immediately", "-t", "List the files in this directory.", "-o", str(output),
            "-c", "mini.yaml", "-c", "model.model_name=openai/forge-env-policy",
            "-c", f"model.model_kwargs.api_base={base_url}", "-c", f"model.model_kwargs.api_key={token}",
            "-c", "model.model_kwargs.max_tokens=24", "-c", "model.cost_tracking=ignore_errors",
            "-c", f"agent.step_limit={STEPS}", "-c", "agent.cost_limit=0",
            "-c", "agent.max_consecutive_format_errors=0"]


async def test_mini_swe_agent_episodes_end_by_their_step_limit_with_token_exact_segments(tmp_path):
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=4))
    gateway = AgentGateway(generator, ChatRenderer(tokenizer),
                           GatewayConfig(default_sampling=SamplingParams(temperature=1.0, max_tokens=24)))
    env = {**os.environ, "MSWEA_CONFIGURED": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(tmp_path),
           "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"), "NO_COLOR": "1"}
    try:
        async with GatewayServer(gateway, GatewayServeSettings(token="mini-token")) as server:
            runs = []
            for number in range(2):
                work = tmp_path / f"run{number}"
                work.mkdir()
                process = await asyncio.create_subprocess_exec(
                    *mini_command(server.episode_url(f"mini{number}"), "mini-token", work / "traj.json"), cwd=work,
                    env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT)
                runs.append(process)
            outputs = [(await process.communicate())[0].decode(errors="replace") for process in runs]
        for number, (process, output) in enumerate(zip(runs, outputs, strict=True)):
            assert process.returncode == 0, output[-3000:]
            record = json.loads((tmp_path / f"run{number}" / "traj.json").read_text())
            assert record["info"]["exit_status"] == "LimitsExceeded", record["info"]
            assert record["info"]["model_stats"]["api_calls"] == STEPS
            trajectory = await gateway.finish(f"mini{number}", reward=0.0)
            trajectory.check()
            assert len(trajectory.turns) == STEPS
            # every reply was dropped by the harness: a new segment per later call, each recorded with why
            edits = [d for d in trajectory.drift if d["kind"] == HISTORY_EDITED]
            assert len(trajectory.segment_starts) == STEPS and len(edits) == STEPS - 1
            # apart from the edits, the tokens equal the template's full re-render (or a control token the
            # random model sampled mid-turn, which is the sample's doing)
            assert {d["kind"] for d in trajectory.drift} <= {HISTORY_EDITED, CONTROL_TOKEN}
            samples = trajectory.to_samples()
            assert len(samples) == STEPS and sum(sum(s.loss_mask) for s in samples) == trajectory.num_sampled_tokens
    finally:
        await generator.aclose()
