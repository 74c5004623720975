"""Builds the GRPO application's parts from its config: model, trainer, weight store, generator, environments.

``build_components(config)`` starts what runs elsewhere (environment replicas and generator replicas on
Monarch), and ``Components.close()`` stops it. Everything heavy is imported here, lazily, so loading or
validating a config stays cheap.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import forge_env
from agents.groups import EnvFactory
from agents.train.config import ConfigError, EnvConfig, GRPOConfig
from forge_env.chat import ChatRenderer
from forge_env.generation.base import Generator
from forge_env.models.protocol import Tokenizer
from forge_env.rl.buffer import ReplayBuffer
from forge_env.rl.protocols import Trainer
from forge_env.weights.store import WeightStore

if TYPE_CHECKING:
    from forge_env.rl.reference import ReferenceModel


@dataclass
class Components:
    """The running parts of one GRPO application."""

    config: GRPOConfig
    tokenizer: Tokenizer
    renderer: ChatRenderer
    trainer: Trainer
    weight_store: WeightStore
    generator: Generator
    env_factory: EnvFactory
    eval_env_factory: EnvFactory
    buffer: ReplayBuffer
    reference: ReferenceModel | None = None
    _closers: list[Any] = field(default_factory=list)

    def add_closer(self, closer: Any) -> None:
        """Have :meth:`close` await ``closer()`` (newest first): for parts added after the build."""
        self._closers.append(closer)

    async def close(self) -> None:
        """Stop services and release the generator, newest first; errors are reported, not raised."""
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception as exc:  # shutting down the rest matters more than one failure
                print(f"[train] while shutting down: {type(exc).__name__}: {exc}", file=sys.stderr)
        self._closers.clear()
        self.weight_store.clear()


def _torch_trainer(config: GRPOConfig, model: Any, weight_store: WeightStore, **overrides: Any) -> Trainer:
    from forge_env.rl.trainer import TorchTrainer

    return TorchTrainer(model, config.trainer.config, weight_store=weight_store, **overrides)


def _titan_trainer(config: GRPOConfig, model: Any, weight_store: WeightStore, **overrides: Any) -> Trainer:
    from forge_env.rl.titan import TitanTrainer
    from forge_env.rl.titan_support import hf_model_name

    titan_config = dataclasses.replace(config.trainer.titan_config(), **overrides)
    if titan_config.hf_assets_path:
        return TitanTrainer(titan_config, weight_store=weight_store)
    if Path(config.model.path).is_dir():  # the model's own shape, in the torchtitan family that reads it
        name = hf_model_name(config.model.path, titan_config.model_name)  # a llama (e.g. SmolLM2): llama3
        titan_config = dataclasses.replace(titan_config, hf_assets_path=config.model.path, flavor="hf", model_name=name)
        return TitanTrainer(titan_config, weight_store=weight_store)
    # torchtitan initialises from a HF checkpoint directory: without one named, the driver's model
    # (e.g. the tiny model, built in memory) is written out, and its shape is the flavor ("hf").
    # The checkpoint is read while the trainer is built, so the directory can go right after.
    with tempfile.TemporaryDirectory(prefix="forge-titan-init-") as init_dir:
        model.save_pretrained(init_dir)
        titan_config = dataclasses.replace(titan_config, hf_assets_path=init_dir, flavor="hf")
        return TitanTrainer(titan_config, weight_store=weight_store)


#: ``trainer.backend`` -> its builder ``(config, model, weight_store, **overrides) -> Trainer``.
TRAINER_BACKENDS: dict[str, Callable[..., Trainer]] = {"torch": _torch_trainer, "titan": _titan_trainer}


def build_trainer(config: GRPOConfig, model: Any, weight_store: WeightStore, **overrides: Any) -> Trainer:
    """The configured trainer (``torch`` or ``titan``, see ``TRAINER_BACKENDS``); ``overrides`` replace
    TrainerConfig fields."""
    try:
        build = TRAINER_BACKENDS[config.trainer.backend]
    except KeyError:
        raise ConfigError(f"unknown trainer.backend {config.trainer.backend!r}; "
                          f"choose one of {sorted(TRAINER_BACKENDS)}") from None
    return build(config, model, weight_store, **overrides)


async def _env_factory(env: EnvConfig, kwargs: dict[str, Any], closers: list[Any], label: str) -> EnvFactory:
    """Environments as an ``EnvService`` (Monarch or local backend) or plain in-process objects."""
    if env.service.backend == "inprocess":
        forge_env.make(env.id, **kwargs).close()  # fail now, not in every episode, on bad kwargs

        def make() -> Any:
            return forge_env.make(env.id, **kwargs)

        return make
    from forge_env.services import EnvService

    service = await EnvService.launch(
        env.id, num_replicas=env.service.num_replicas, max_episodes_per_replica=env.service.max_episodes_per_replica,
        env_kwargs=kwargs, backend=env.service.backend, mesh_name=f"{label}_{uuid.uuid4().hex[:6]}",
        hosts=env.service.hosts, replicas_per_host=env.service.replicas_per_host)
    closers.append(service.shutdown)
    return service.env


async def _same_host_source(store: WeightStore, closers: list[Any]) -> Any:
    """Generators on this host read the store itself."""
    return store


async def _relay_source(store: WeightStore, closers: list[Any]) -> Any:
    """Generators on other hosts read through a relay (chunks over actor messages into a copy on their host)."""
    from forge_env.weights.relay import RemoteWeightSource, spawn_weight_server

    server, procs = await spawn_weight_server(store)
    closers.append(procs.stop)
    return RemoteWeightSource(server, store.name)


#: ``generator.weight_transport`` (resolved) -> (the WeightStore backend, what generators read pushed weights
#: from: ``source(store, closers)``).
WEIGHT_TRANSPORTS: dict[str, tuple[str, Callable[..., Any]]] = {
    "ring": ("ring", _same_host_source),
    "shm": ("shm", _same_host_source),
    "monarch": ("ring", _relay_source),
}


def generator_config(config: GRPOConfig) -> dict[str, Any]:
    """``generator.config`` plus, when the trainer trains a LoRA adapter, that adapter's config: the
    generators then serve base + the pushed adapter."""
    lora = config.trainer.config.lora
    return {**config.generator.config, **({"lora": dataclasses.asdict(lora)} if lora is not None else {})}


async def _generator(config: GRPOConfig, model: Any, tokenizer: Tokenizer, weight_store: Any,
                     closers: list[Any]) -> Generator:
    gen = config.generator
    if gen.service:
        from forge_env.generation.service import GeneratorService

        service = await GeneratorService.launch(
            config.model.path, backend=gen.backend, num_replicas=gen.num_replicas, config=generator_config(config),
            device=gen.device, seed=config.model.seed, weight_source=weight_store, hosts=gen.hosts)
        closers.append(service.shutdown)
        return service
    from forge_env.generation import make_generator
    from forge_env.rl.lora import base_model_copy

    # Its own copy of the weights: the generator must keep sampling from the pushed version while the
    # trainer (maybe in another thread) updates the training copy. With LoRA: the base, without the adapter.
    # In process it wraps a loaded model, so it is ``hf`` (the config checks refuse vllm without a service).
    generator = make_generator("hf", model=base_model_copy(model).eval(), tokenizer=tokenizer,
                               config=generator_config(config), weight_source=weight_store)
    closers.append(generator.aclose)
    return generator


async def build_components(config: GRPOConfig) -> Components:
    """Load the model, start the services, and wire trainer -> weight store -> generator."""
    from forge_env.models import load_model_and_tokenizer, resolve_model

    config.validate()
    # A model id (``smollm2-135m-instruct``) or a .gguf file becomes its checkpoint directory, for every part below.
    config.model.path = resolve_model(config.model.path)
    if config.sft.enabled and config.trainer.backend != "torch":
        raise ConfigError("sft.enabled needs trainer.backend=torch (warm up separately for torchtitan runs)")
    model, tokenizer = load_model_and_tokenizer(config.model.path, seed=config.model.seed)
    rc = config.renderer
    renderer = ChatRenderer(tokenizer, parser=rc.parser, chat_template=rc.chat_template, strict=rc.strict,
                            reasoning=rc.reasoning, check_drift=rc.check_drift)
    if isinstance(renderer.parser, str) and renderer.parser != "hermes":  # hermes is every env's default
        config.env.kwargs.setdefault("tool_parser", renderer.parser)
    store_backend, weight_source_of = WEIGHT_TRANSPORTS[config.generator.resolved_weight_transport()]
    weight_store = WeightStore(f"forge-train-{os.getpid()}-{uuid.uuid4().hex[:6]}", keep_versions=2,
                               backend=store_backend)
    closers: list[Any] = []
    try:
        _connect_job(config, closers)
        trainer = build_trainer(config, model, weight_store)
        _reserve_trainer_gpu(trainer)
        weight_source = await weight_source_of(weight_store, closers)
        generator = await _generator(config, trainer.model if config.trainer.backend == "torch" else model,
                                     tokenizer, weight_source, closers)
        env_factory = await _env_factory(config.env, config.env.kwargs, closers, "train_env")
        eval_kwargs = {**config.env.kwargs, **config.eval.env_kwargs}
        eval_env_factory = await _env_factory(config.env, eval_kwargs, closers, "eval_env")
    except BaseException:
        for closer in reversed(closers):
            await closer()
        weight_store.clear()
        raise
    return Components(config=config, tokenizer=tokenizer, renderer=renderer, trainer=trainer,
                      weight_store=weight_store, generator=generator, env_factory=env_factory,
                      eval_env_factory=eval_env_factory, buffer=ReplayBuffer(buffer_config(config)), _closers=closers)


def buffer_config(config: GRPOConfig) -> Any:
    """``config.buffer``, its ``staleness`` resolved: per token under partial rollouts, else per episode."""
    if config.buffer.staleness is not None:
        return config.buffer
    return dataclasses.replace(config.buffer, staleness="token" if config.loop.partial_rollouts else "episode")


def _connect_job(config: GRPOConfig, closers: list[Any]) -> None:
    """Register the host groups of ``config.job``; a job this run applied is killed when the run ends
    (one that was already running, e.g. a SLURM allocation loaded from its state file, is left running)."""
    if config.job is None:
        return
    from forge_env.services import placement

    job = placement.load_job(config.job)
    applied_here = not job.active
    groups = placement.use_job(job)
    print(f"[train] Monarch job {type(job).__name__}: host groups "
          + ", ".join(f"{name} ({len(group)} hosts)" for name, group in groups.items()), file=sys.stderr)

    async def release() -> None:
        placement.clear_host_groups()
        if applied_here:
            job.kill()

    closers.append(release)


def _reserve_trainer_gpu(trainer: Trainer) -> None:
    """A trainer on a GPU in this process keeps that GPU: generator replicas must be placed elsewhere."""
    device = str(getattr(trainer, "device", "cpu"))
    if not device.startswith("cuda"):
        return
    from forge_env.services import reserve_gpus

    # The first visible GPU: where torch puts this process's cuda:0 (and torchtitan's LOCAL_RANK 0).
    reserve_gpus(1, "the trainer in the driver process")


def build_reference(config: GRPOConfig, trainer: Trainer) -> ReferenceModel | None:
    """A frozen copy of the trainer's current policy for the KL term, when the config asks for one.

    A TitanTrainer's model is torchtitan's (sharded) module, so its reference is the transformers model
    it started from (``model.path``), the same weights. A LoRA trainer's reference is its base without the
    adapter (the warmed-up base after ``sft.full_weights``), also when a resumed adapter has moved.
    """
    if not config.uses_reference_model():
        return None
    from forge_env.rl.reference import ReferenceModel

    cfg = config.trainer.config
    model = trainer.model
    if config.trainer.backend == "titan":
        from forge_env.models import load_model_and_tokenizer

        model = load_model_and_tokenizer(config.model.path, seed=config.model.seed)[0]
    elif cfg.lora is not None:
        from forge_env.rl.lora import base_model_copy

        model = base_model_copy(model)
    return ReferenceModel(model, device=cfg.device, precision=cfg.precision,
                          micro_batch_size=cfg.micro_batch_size, temperature=cfg.temperature)
