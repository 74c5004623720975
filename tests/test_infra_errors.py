"""One ``InfraError`` base: every failure of the machine derives from it (keeping its old base), and the
rollout masks exactly those episodes as ``infra_error``; the policy's and the caller's errors stay ``error``."""

import pytest

import forge_env
import forge_env.errors
import forge_env.tools
from agents.rollout import run_episode
from forge_env import EnvError, TextEnv, Tool, ToolError
from forge_env.chat import ChatRenderer
from forge_env.generation.base import GenerationError, SamplingParams
from forge_env.generation.endpoints import EndpointError
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model
from forge_env.sandbox import SandboxBusyError, SandboxClosedError, SandboxError, SandboxUnavailableError
from forge_env.sandbox.base import InvalidFilesError
from forge_env.services import (
    EnvCapacityError,
    NoHealthyReplicaError,
    ReplicaFailedError,
    ReplicaSpawnError,
    ServiceClosedError,
    ServiceError,
    ServiceOverloadedError,
    SessionLimitError,
    SessionLostError,
)
from forge_env.services.errors import HostUnreachableError

InfraError = forge_env.errors.InfraError
# Stopping on any letter ends a random model's turn early, so the env is asked to step.
STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))

# agents/rollout.py's INFRA_ERRORS tuple before the one base existed
OLD_INFRA_ERRORS = (forge_env.tools.InfraError, SandboxError, ReplicaFailedError, SessionLostError,
                    NoHealthyReplicaError)


def test_one_infra_error_class_under_every_name():
    assert forge_env.InfraError is forge_env.tools.InfraError is InfraError


@pytest.mark.parametrize("cls", OLD_INFRA_ERRORS, ids=lambda c: c.__name__)
def test_every_old_infra_error_derives_from_the_one_base(cls):
    assert issubclass(cls, InfraError)


@pytest.mark.parametrize("cls, old_base", [
    (SandboxUnavailableError, SandboxError), (SandboxClosedError, SandboxError), (SandboxBusyError, SandboxError),
    (SandboxError, RuntimeError), (ReplicaFailedError, ServiceError), (SessionLostError, ServiceError),
    (NoHealthyReplicaError, ServiceError), (ServiceOverloadedError, ServiceError),
    (HostUnreachableError, ReplicaSpawnError), (EndpointError, GenerationError),
], ids=lambda c: c.__name__)
def test_machine_failures_are_infra_errors_and_keep_their_old_base(cls, old_base):
    assert issubclass(cls, InfraError) and issubclass(cls, old_base) and issubclass(cls, RuntimeError)


@pytest.mark.parametrize("cls", [SessionLimitError, EnvCapacityError, ServiceClosedError, ReplicaSpawnError,
                                 ServiceError, InvalidFilesError, EnvError, ToolError, GenerationError],
                         ids=lambda c: c.__name__)
def test_the_callers_own_errors_are_not_infra_errors(cls):
    assert not issubclass(cls, InfraError)


async def test_a_tool_whose_sandbox_is_unavailable_ends_the_episode_instead_of_answering_the_model():
    async def run() -> str:
        raise SandboxUnavailableError("no isolation on this machine")

    python = Tool("python", "Run code.", {"type": "object", "properties": {}}, run)
    env = TextEnv(tasks=[{"question": "q"}], tools=[python])
    await env.areset(seed=0)
    with pytest.raises(SandboxUnavailableError):
        await env.astep('<tool_call>{"name": "python", "arguments": {}}</tool_call>')
    assert env.state.done and env.state.released


class StepRaises:
    """Math-v0, except that its step raises ``error`` (as a broken sandbox or a dead replica would)."""

    def __init__(self, error: BaseException) -> None:
        self.env = forge_env.make("forge_env/Math-v0")
        self.error = error

    async def areset(self, **kw):
        return await self.env.areset(**kw)

    async def astep(self, action):
        raise self.error


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=4))
    yield generator, ChatRenderer(tokenizer)
    generator.close()


@pytest.mark.parametrize("error, status", [
    (SandboxUnavailableError("no isolation"), "infra_error"),
    (SessionLostError("replica 0 died", session_id="s"), "infra_error"),
    (ServiceOverloadedError("queue full"), "infra_error"),
    (InfraError("grading failed"), "infra_error"),
    (EnvError("env bug"), "error"),
    (ValueError("env bug"), "error"),
    (SessionLimitError("too many sessions"), "error"),
    (EndpointError("judge endpoint down"), "error"),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v)
async def test_the_rollout_masks_exactly_the_machines_failures(kit, error, status):
    generator, renderer = kit
    trajectory = await run_episode(StepRaises(error), generator, renderer, seed=0,
                                   sampling=SamplingParams(temperature=1.0, max_tokens=40, stop_token_ids=STOP_ON_LETTERS,
                                                            seed=0))
    assert trajectory.status == status, trajectory.error
    assert type(error).__name__ in trajectory.error
    if isinstance(error, EndpointError):
        assert trajectory.error_kind == "endpoint"  # counted apart by evaluation, as before


def test_the_errors_module_imports_nothing():
    """The sandbox package imports it and must stay standard-library only (see tests/test_sandbox.py)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(forge_env.errors.__file__).read_text())
    imported = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in imported)
