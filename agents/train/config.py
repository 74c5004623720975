"""The GRPO application's configuration: one dataclass per component, loaded from one YAML file.

``load_grpo_config("app.yaml", ["trainer.config.lr=1e-5", "loop.steps=20"])`` reads the file,
applies dotted overrides, checks every key and type (``forge_env.config``), then checks the
sections against each other (:meth:`GRPOConfig.validate`). Every field has a default, so an
empty file is the CPU demo's shape with the tiny model. The sections live in
:mod:`agents.train.config_sections` and are re-exported here; the checks across sections (or of the named
components: env id, parser, loss, generator config class) are below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.train.config_sections import (
    ENV_REWARD,
    AdvantageConfig,
    CurriculumConfig,
    DynamicSamplingConfig,
    EnvConfig,
    EnvServiceConfig,
    EvalConfig,
    GatewaySourceConfig,
    GeneratorConfig,
    LoggingConfig,
    LoopConfig,
    ModelConfig,
    RendererConfig,
    RolloutConfig,
    SamplingConfig,
    TrainerSection,
)
from agents.train.sft_config import SFTConfig
from forge_env.config import ConfigError, load_config
from forge_env.rl.buffer import ReplayBufferConfig

__all__ = [
    "AdvantageConfig",
    "ConfigError",
    "CurriculumConfig",
    "DynamicSamplingConfig",
    "ENV_REWARD",
    "EnvConfig",
    "EnvServiceConfig",
    "EvalConfig",
    "GRPOConfig",
    "GatewaySourceConfig",
    "GeneratorConfig",
    "LoggingConfig",
    "LoopConfig",
    "ModelConfig",
    "RendererConfig",
    "RolloutConfig",
    "SFTConfig",
    "SamplingConfig",
    "TrainerSection",
    "load_grpo_config",
    "loss_kl_coef",
    "validate_grpo_config",
]


@dataclass
class GRPOConfig:
    """The whole GRPO application (see the module docstring)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    renderer: RendererConfig = field(default_factory=RendererConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    buffer: ReplayBufferConfig = field(default_factory=lambda: ReplayBufferConfig(batch_size=64, max_policy_age=1))
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    job: str | None = None
    """A Monarch job whose host groups the roles' ``hosts`` name: a ``.py`` file defining ``job``, a
    ``module.attr`` path, or a file written by ``job.dump()`` (``forge-env train --job``)."""

    def uses_reference_model(self) -> bool:
        """Whether the run keeps a frozen reference policy (see ``TrainerSection.reference_model``)."""
        if self.trainer.reference_model is None:
            return self._kl_coef() > 0
        return self.trainer.reference_model

    def _kl_coef(self) -> float:
        """The KL coefficient the loss will use (its own default unless loss_kwargs sets one)."""
        return loss_kl_coef(self.trainer.config.loss, self.trainer.config.loss_kwargs)

    def validate(self) -> GRPOConfig:
        """Check the sections against each other and that the named components exist; raise ConfigError."""
        validate_grpo_config(self)
        return self


def load_grpo_config(path: str | Path | None = None, overrides: list[str] | None = None) -> GRPOConfig:
    """Read a GRPO app config (YAML) with dotted ``overrides`` and validate it."""
    return load_config(GRPOConfig, path, overrides).validate()


def check_generator_config(config: GRPOConfig) -> None:
    """``generator.config`` must build the backend's config class (HF and vLLM take different fields)."""
    from forge_env.config import from_dict

    if "model" in config.generator.config:
        raise ConfigError("generator.config.model: the generator serves model.path; set that instead")
    if "lora" in config.generator.config:
        raise ConfigError("generator.config.lora: the generators serve the adapter of trainer.config.lora; "
                          "set that instead")
    if config.generator.backend == "vllm":
        from forge_env.generation.vllm import VLLMGeneratorConfig

        from_dict(VLLMGeneratorConfig, {"model": config.model.path, **config.generator.config}, "generator.config")
    else:
        from forge_env.generation.hf import HFGeneratorConfig

        from_dict(HFGeneratorConfig, config.generator.config, "generator.config")


def validate_grpo_config(config: GRPOConfig) -> None:
    """Check the sections against each other and that the named components exist; raise ConfigError."""
    import forge_env
    from forge_env.rl.advantages import ADVANTAGE_MODES

    try:
        forge_env.spec(config.env.id)
    except Exception as exc:
        raise ConfigError(f"env.id: {exc}") from None
    if config.renderer.parser is not None:
        from forge_env.tools import parser_names

        if config.renderer.parser not in parser_names():
            raise ConfigError(f"renderer.parser: {config.renderer.parser!r} is not one of {parser_names()}")
    if config.advantages.method not in ADVANTAGE_MODES:
        raise ConfigError(f"advantages.method: {config.advantages.method!r} is not one of {list(ADVANTAGE_MODES)}")
    if config.trainer.backend == "titan":
        config.trainer.titan_config()
    if config.sft.full_weights and (config.trainer.config.lora is None or not config.sft.enabled):
        raise ConfigError("sft.full_weights trains every weight in the warm-up and attaches trainer.config.lora's "
                          "adapter after it: it needs sft.enabled=true and trainer.config.lora set")
    per_step = config.rollout.group_size * config.rollout.groups_per_step
    batch = config.buffer.batch_size * config.buffer.dp_size
    if batch > per_step:
        raise ConfigError(f"buffer.batch_size x dp_size ({batch}) is more than one step's rollouts "
                          f"(rollout.group_size x groups_per_step = {per_step}); training could never start")
    if config.buffer.keep_groups and batch % config.rollout.group_size:
        raise ConfigError(f"buffer.keep_groups needs buffer.batch_size ({batch}) to be a multiple of "
                          f"rollout.group_size ({config.rollout.group_size})")
    check_partial_rollouts(config)
    if config.generator.backend == "vllm" and not config.generator.service:
        raise ConfigError("generator.backend=vllm runs as a service; set generator.service=true")
    check_generator_config(config)
    if config.trainer.config.loss == "sft":
        raise ConfigError("trainer.config.loss: 'sft' is the warm-up's loss (section sft); pick an RL loss")
    if abs(config.trainer.config.temperature - config.rollout.sampling.temperature) > 1e-9:
        raise ConfigError(
            f"trainer.config.temperature ({config.trainer.config.temperature}) must equal "
            f"rollout.sampling.temperature ({config.rollout.sampling.temperature}) so the trainer's logprobs "
            "match the sampler's")
    if loss_kl_coef(config.trainer.config.loss, config.trainer.config.loss_kwargs) > 0 and config.trainer.reference_model is False:
        raise ConfigError(f"trainer.config.loss {config.trainer.config.loss!r} has kl_coef={loss_kl_coef(config.trainer.config.loss, config.trainer.config.loss_kwargs)}, which "
                          "needs trainer.reference_model (true or unset), or set trainer.config.loss_kwargs.kl_coef=0")
    placed = {"env.service.hosts": config.env.service.hosts, "generator.hosts": config.generator.hosts}
    for key, group in placed.items():
        if group is not None and config.job is None:
            raise ConfigError(f"{key}={group} names a host group of a Monarch job: pass --job (a job spec "
                              "file) or set job=...")
    if config.env.service.hosts is not None and config.env.service.backend != "monarch":
        raise ConfigError("env.service.hosts needs env.service.backend=monarch")
    if config.generator.hosts is not None and not config.generator.service:
        raise ConfigError("generator.hosts needs generator.service=true")
    if config.generator.weight_transport == "monarch" and not config.generator.service:
        raise ConfigError("generator.weight_transport=monarch needs generator.service=true")
    if config.loop.mode == "async" and config.buffer.max_policy_age is None:
        raise ConfigError("loop.mode=async needs buffer.max_policy_age (the staleness bound)")
    if config.rollout.dynamic_sampling.enabled and not config.advantages.drop_zero_variance:
        raise ConfigError("rollout.dynamic_sampling tops rounds up for the groups advantages.drop_zero_variance "
                          "drops; set advantages.drop_zero_variance=true")
    from agents.train.sampling import build_task_sampler

    try:
        build_task_sampler(config.rollout.curriculum.sampler, config.rollout.curriculum.kwargs,
                           seed_start=config.env.seed_start, seed=config.loop.seed)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rollout.curriculum: {exc}") from None


def loss_kl_coef(loss: str, loss_kwargs: dict[str, Any]) -> float:
    """The KL coefficient ``loss`` uses: ``loss_kwargs['kl_coef']``, else the loss function's own default."""
    import inspect

    from forge_env.rl.losses import get_loss

    param = inspect.signature(get_loss(loss)).parameters.get("kl_coef")
    return float(loss_kwargs.get("kl_coef", param.default if param is not None else 0.0) or 0.0)


def check_partial_rollouts(config: GRPOConfig) -> None:
    """``loop.partial_rollouts`` streams env episodes in the async loop, exact per turn (see agents.train.partial)."""
    loop = config.loop
    if not loop.partial_rollouts:
        if loop.overprovision:
            raise ConfigError("loop.overprovision applies to partial rollouts: set loop.partial_rollouts=true")
        return
    if loop.mode != "async":
        raise ConfigError("loop.partial_rollouts needs loop.mode=async (the sync loop samples at one version)")
    if config.rollout.source != "env":
        raise ConfigError("loop.partial_rollouts streams environment episodes; rollout.source=gateway plays "
                          "harness runs in rounds: turn one of them off")
    if config.rollout.dynamic_sampling.enabled:
        raise ConfigError("loop.partial_rollouts already plays groups until the buffer can fill a batch "
                          "(rollout.dynamic_sampling's extra passes belong to rounds): turn dynamic sampling off")
    if config.generator.config.get("keep_sessions_on_update"):
        raise ConfigError("generator.config.keep_sessions_on_update=true with loop.partial_rollouts: an episode's "
                          "turns after a weight update would attend to KV computed by the old weights, so their "
                          "logprobs would not be the new policy's; leave it false (the turn re-prefills)")
