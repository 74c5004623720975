"""The sections of the GRPO application's configuration: one dataclass per component.

Each section checks its own fields (``__post_init__``); :mod:`agents.train.config` joins them into
``GRPOConfig`` and checks them against each other. Users import them from :mod:`agents.train.config`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Literal

from agents.groups import LostEpisodes
from forge_env.config import ConfigError
from forge_env.models import TINY_MODEL_ID
from forge_env.rl.trainer import TrainerConfig


@dataclass
class ModelConfig:
    """The policy: a checkpoint directory, a hub id, or the tiny model kit's id (built locally)."""

    path: str = TINY_MODEL_ID
    seed: int = 0
    """Seed of the tiny model's initial weights (ignored for real checkpoints)."""


@dataclass
class RendererConfig:
    """How conversations become tokens (``forge_env.chat.ChatRenderer``); see docs/generation.md's table."""

    parser: str | None = None
    """Tool-call format (``hermes``, ``llama3_json``, ``mistral``, ``deepseek_v3``, ``harmony``, ``kimi_k2``);
    None detects it from the chat template. The environments parse with the same one unless
    ``env.kwargs.tool_parser`` says otherwise."""
    reasoning: Literal["keep", "rerender"] = "keep"
    """Where the template drops earlier reasoning: keep the sampled reasoning in context (token-exact to what
    the policy saw; reported as drift) or re-render as the template would (a new context segment)."""
    strict: bool = False
    """Fail an episode whose tokens drift from the template for any other reason."""
    check_drift: bool = True
    chat_template: str | None = None
    """A jinja chat template to use instead of the checkpoint's."""


@dataclass
class EnvServiceConfig:
    """How environments run: ``monarch`` (CPU replicas in their own processes), ``local`` (the same
    service API in this process) or ``inprocess`` (plain ``TextEnv`` objects, no service)."""

    backend: Literal["monarch", "local", "inprocess"] = "monarch"
    num_replicas: int = 1
    max_episodes_per_replica: int = 256
    hosts: str | None = None
    """Host group of the Monarch job (``--job``) the replicas run on, e.g. ``cpu``; default: this host."""
    replicas_per_host: int | None = None

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.max_episodes_per_replica < 1:
            raise ValueError("num_replicas and max_episodes_per_replica must be >= 1")


@dataclass
class EnvConfig:
    """The task source: a registered environment id; training tasks are drawn with seeds from a counter."""

    id: str = "forge_env/Arithmetic-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``forge_env.make`` (difficulty, split, ...)."""
    seed_start: int = 0
    """Training task ``i`` is ``reset(seed=seed_start + i)``; the position is checkpointed."""
    service: EnvServiceConfig = field(default_factory=EnvServiceConfig)


#: ``generator.weight_transport`` values.
WEIGHT_TRANSPORT_NAMES = ("auto", "ring", "shm", "monarch")


@dataclass
class GeneratorConfig:
    """The generator: ``hf`` (transformers) or ``vllm`` (vLLM's engine), CPU or GPU; in-process or a Monarch service."""

    backend: Literal["hf", "vllm"] = "hf"
    service: bool = True
    """Run as a ``GeneratorService`` (replicas in their own processes, weights through the WeightStore)."""
    num_replicas: int = 1
    hosts: str | None = None
    """Host group of the Monarch job (``--job``) the replicas run on, e.g. ``gpu``; default: this host."""
    device: str | None = None
    """``cpu``/``cuda``; default cuda when a GPU is visible."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``HFGeneratorConfig`` / ``VLLMGeneratorConfig``."""
    weight_transport: str = "auto"
    """How pushed weights reach the generators: ``ring`` (shared-memory slots on this host), ``shm`` (a file
    per version on this host), ``monarch`` (chunks over actor messages into a copy on each generator host);
    ``auto``: ``ring`` when the generators run on this host (no ``hosts``), ``monarch`` when they do not."""

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        if self.weight_transport not in WEIGHT_TRANSPORT_NAMES:
            from forge_env.weights.store import UNSUPPORTED_BACKENDS

            if self.weight_transport in UNSUPPORTED_BACKENDS:  # torchstore: removed, and says why
                raise ValueError(f"generator.weight_transport: {UNSUPPORTED_BACKENDS[self.weight_transport]}")
            close = difflib.get_close_matches(self.weight_transport, WEIGHT_TRANSPORT_NAMES, n=2)
            raise ValueError(f"generator.weight_transport must be one of {list(WEIGHT_TRANSPORT_NAMES)}, not "
                             f"{self.weight_transport!r}" + (f"; did you mean {close}?" if close else ""))

    def resolved_weight_transport(self) -> str:
        """The transport ``auto`` stands for with this placement."""
        if self.weight_transport != "auto":
            return self.weight_transport
        return "ring" if self.hosts is None else "monarch"


@dataclass
class SamplingConfig:
    """Sampling for each assistant turn during training rollouts."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    """Tokens per assistant turn (the episode's token budget may shrink it)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that also end a turn (kept in the turn), besides the model's and the template's end-of-turn."""


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (``agents.train.sampling``): top a round up with more groups until
    ``groups_per_step`` groups with varying rewards are in."""

    enabled: bool = False
    max_rounds: int = 4
    """The bound: a round plays at most ``max_rounds x groups_per_step`` groups (1: no extra sampling)."""

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")


@dataclass
class CurriculumConfig:
    """Which env seed each training task plays (``agents.train.sampling.TaskSampler``)."""

    sampler: str = "sequential"
    """``sequential`` (task i is seed ``env.seed_start + i``), ``pass_rate`` (a pool of seeds weighted by their
    recent pass rate), or ``package.module:factory`` for your own."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the sampler (``pass_rate``: ``pool_size``, ``window``, ``min_weight``)."""


#: ``rollout.gateway.reward`` value: the ``env`` section's environment grades each harness episode.
ENV_REWARD = "env"


@dataclass
class GatewaySourceConfig:
    """``rollout.source: gateway``: each episode is one run of an unmodified harness against the agent gateway
    (docs/gateway.md). ``command`` is a template with ``{base_url}``, ``{episode_id}``, ``{api_key}``, ``{seed}``
    (the task's seed) and ``{group_id}``; ``reward`` names a function ``module:function`` called with
    ``(trajectory, result)`` (``agents.gateway.harness.HarnessResult``) that returns the episode's reward, or is
    ``env``: the environment of the ``env`` section grades each episode (the harness runs its tools through the
    gateway; the template may use ``{task}``, the opening user message, and ``{task_id}``)."""

    command: str = ""
    reward: str = ""
    timeout_s: float = 600.0


@dataclass
class RolloutConfig:
    """How many episodes one training step collects, and each episode's budget."""

    source: Literal["env", "gateway"] = "env"
    """``env``: the rollout loop plays the environment; ``gateway``: harness processes through the gateway."""
    gateway: GatewaySourceConfig = field(default_factory=GatewaySourceConfig)

    group_size: int = 8
    """Episodes per task (a GRPO group)."""
    groups_per_step: int = 8
    max_turns: int | None = None
    max_total_tokens: int | None = 2048
    step_timeout_s: float | None = 60.0
    deadline_s: float | None = None
    max_episodes_in_flight: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    lost_episodes: Literal["refill", "drop"] = "refill"
    """An episode the machine spoiled (``infra_error``): ``refill`` plays it again from scratch (same task and
    sampling seed; the failed attempt stays in the group's trajectories, marked), ``drop`` drops its group
    whole. Never is the group normalised over its survivors (``agents.groups``)."""
    max_refills: int = 2
    """Refills one group may spend (``lost_episodes: refill``); a group that needs more is dropped whole."""

    def lost_episodes_policy(self) -> LostEpisodes:
        """``lost_episodes`` and ``max_refills`` as the policy :func:`agents.groups.stream_groups` takes."""
        return LostEpisodes(self.lost_episodes, self.max_refills)

    def __post_init__(self) -> None:
        if self.max_refills < 0:
            raise ValueError(f"rollout.max_refills must be >= 0, got {self.max_refills}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares episodes of a task), got {self.group_size}")
        if self.groups_per_step < 1 or self.max_episodes_in_flight < 1:
            raise ValueError("groups_per_step and max_episodes_in_flight must be >= 1")
        if self.source == "gateway" and not (self.gateway.command and (
                ":" in self.gateway.reward or self.gateway.reward == ENV_REWARD)):
            raise ValueError("rollout.source=gateway needs rollout.gateway.command (a harness command template) and "
                             f"rollout.gateway.reward (module:function, or {ENV_REWARD!r}: the env section grades)")


@dataclass
class AdvantageConfig:
    """Per-group advantages (``forge_env.rl.advantages``)."""

    method: str = "grpo"
    """``grpo`` (group-normalised), ``dr_grpo`` (mean only) or ``loo`` (leave-one-out)."""
    drop_zero_variance: bool = True
    """Skip groups whose episodes all earned the same reward (they carry no signal)."""


@dataclass
class TrainerSection:
    """The trainer: ``torch`` (plain PyTorch, CPU or one GPU) or ``titan`` (torchtitan, GPUs)."""

    backend: Literal["torch", "titan"] = "torch"
    config: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-5))
    titan: dict[str, Any] = field(default_factory=dict)
    """Extra ``TitanTrainerConfig`` options (parallelism, flavour, ...), titan backend only."""
    reference_model: bool | None = None
    """Keep a frozen copy of the starting policy for the KL term. ``None``: exactly when the loss has a
    KL term (``config.loss_kwargs.kl_coef``, else the loss's own default, e.g. 0.04 for ``grpo``)."""

    def titan_config(self) -> Any:
        """``config`` plus the ``titan`` options as a ``TitanTrainerConfig`` (ConfigError on a bad option)."""
        import dataclasses

        from forge_env.rl.titan_config import TitanTrainerConfig

        known = {f.name for f in dataclasses.fields(TitanTrainerConfig)}
        unknown = sorted(set(self.titan) - known)
        if unknown:
            raise ConfigError(f"trainer.titan: unknown option(s) {unknown}; see TitanTrainerConfig")
        try:
            return TitanTrainerConfig(**{**dataclasses.asdict(self.config), **self.titan})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"trainer.titan: {exc}") from None


@dataclass
class EvalConfig:
    """Held-out evaluation: success rate (share of episodes with full reward) on fixed tasks."""

    every: int = 0
    """Evaluate every N training steps (0: only before and after training)."""
    num_tasks: int = 100
    seed_start: int = 2_000_000
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of ``env.kwargs`` for evaluation (e.g. ``split: test``)."""
    temperature: float = 0.0
    max_tokens: int | None = None
    """Tokens per turn (default: ``rollout.sampling.max_tokens``)."""
    success_threshold: float = 1.0
    """An episode counts as a success when its reward is at least this."""
    view_episodes: int = 8
    """Evaluation episodes shown in the final HTML view."""


@dataclass
class LoopConfig:
    """The training loop."""

    mode: Literal["sync", "async"] = "sync"
    """``sync``: collect a batch at the current policy, train, sync weights. ``async``: rollouts and training
    run continuously, joined by the replay buffer (staleness bounded by ``buffer.max_policy_age``)."""
    steps: int = 20
    seed: int = 0
    output_dir: str = "runs/grpo"
    checkpoint_every: int = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    resume: bool = False
    """Continue from the newest checkpoint in ``output_dir`` when there is one."""
    max_rollouts_ahead: int = 2
    """Async mode: rollout batches collected ahead of the trainer before rollouts wait."""
    partial_rollouts: bool = False
    """Async mode: episodes stream instead of playing in rounds, and a weight update lands without waiting for
    them (they go on with the new weights from their next turn, which re-prefills); ``buffer.max_policy_age``
    then bounds staleness per token (``buffer.staleness`` defaults to ``token``). See agents.train.partial."""
    overprovision: int = 0
    """Partial rollouts, APRIL-style: extra groups in flight; the slowest are aborted as each round's worth ends."""
    max_rounds_without_step: int = 50
    """Rollout rounds in a row that may pass without an optimizer step (their groups' episodes all earned
    equal rewards, so too little was trainable to fill a batch) before RL stops and says so: the run
    ends with ``RunResult.rl_stopped`` set instead of rolling out until it is cut off."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.checkpoint_every < 0 or self.max_rollouts_ahead < 1:
            raise ValueError("steps and checkpoint_every must be >= 0, max_rollouts_ahead >= 1")
        if self.overprovision < 0:
            raise ValueError(f"overprovision must be >= 0, got {self.overprovision}")
        if self.max_rounds_without_step < 1:
            raise ValueError(f"max_rounds_without_step must be >= 1, got {self.max_rounds_without_step}")


@dataclass
class LoggingConfig:
    """Where metrics go: always JSONL in the output directory; TensorBoard and wandb when available."""

    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "forge-env"
    progress: bool = True
    """Print a progress line per step."""
