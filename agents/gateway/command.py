"""``forge-env gateway CONFIG``: serve a model through the agent gateway until interrupted.

The config is YAML (every key has a default; dotted overrides follow the file, ``serve.port=9000``)::

    model: {path: forge-env/tiny-qwen3}
    renderer: {parser: null, reasoning: keep}
    generator: {backend: hf, service: false, device: null, config: {max_batch_size: 16}}
    sampling: {temperature: 1.0, top_p: 1.0, max_tokens: 512}
    gateway: {max_episodes: 1024, episode_ttl_s: 3600, auto_open: true}
    serve: {host: 127.0.0.1, port: 8100, max_body_mb: 8}
    trajectories: runs/gateway.jsonl

Harnesses use ``http://HOST:PORT/e/<episode id>/v1`` as their OpenAI base URL, with the bearer token of
``$FORGE_ENV_GATEWAY_TOKEN`` when set. A trainer closes episodes with ``POST /admin/episodes/<id>/finish``
(``{"reward": r, "status": "ok"}``) and the token of ``$FORGE_ENV_GATEWAY_ADMIN_TOKEN`` (the admin routes exist
only with it); each finished trajectory is answered and appended to ``trajectories`` when set.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from agents.train.config import GeneratorConfig, ModelConfig, RendererConfig

TOKEN_ENV_VAR = "FORGE_ENV_GATEWAY_TOKEN"
ADMIN_TOKEN_ENV_VAR = "FORGE_ENV_GATEWAY_ADMIN_TOKEN"


@dataclass
class GatewaySamplingConfig:
    """Defaults of a call's sampling (a request's own values win); ``max_tokens`` is also the ceiling."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512


@dataclass
class GatewayLimitsConfig:
    model_name: str = "forge-env-policy"
    max_episodes: int = 1024
    episode_ttl_s: float | None = 3600.0
    max_calls_per_episode: int = 1000
    auto_open: bool = True
    tool_choice_retries: int = 2


@dataclass
class GatewayServeConfig:
    host: str = "127.0.0.1"
    port: int = 8100
    max_body_mb: float = 8.0
    header_timeout_s: float = 10.0


@dataclass
class GatewayAppConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    renderer: RendererConfig = field(default_factory=RendererConfig)
    generator: GeneratorConfig = field(default_factory=lambda: GeneratorConfig(service=False))
    sampling: GatewaySamplingConfig = field(default_factory=GatewaySamplingConfig)
    gateway: GatewayLimitsConfig = field(default_factory=GatewayLimitsConfig)
    serve: GatewayServeConfig = field(default_factory=GatewayServeConfig)
    trajectories: str | None = None
    """JSONL file each trajectory finished over HTTP is appended to."""


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="YAML config (default: the tiny model, port 8100)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. serve.port=0 sampling.max_tokens=64")


def load_gateway_config(path: str | None, overrides: list[str] | None = None) -> GatewayAppConfig:
    from forge_env.config import load_config

    return load_config(GatewayAppConfig, path, overrides)


async def build_generator(config: GatewayAppConfig, closers: list[Any]) -> tuple[Any, Any]:
    """The generator and its tokenizer, as the config says (in-process HF, or a GeneratorService)."""
    from forge_env.models import load_model_and_tokenizer, resolve_model

    config.model.path = resolve_model(config.model.path)  # a model id or .gguf file: its checkpoint directory
    gen = config.generator
    if gen.service:
        from forge_env.generation.service import GeneratorService
        from forge_env.models.loading import load_tokenizer

        service = await GeneratorService.launch(config.model.path, backend=gen.backend, num_replicas=gen.num_replicas,
                                                config=gen.config, device=gen.device, seed=config.model.seed,
                                                hosts=gen.hosts)
        closers.append(service.shutdown)
        return service, load_tokenizer(config.model.path)
    if gen.backend != "hf":
        raise ValueError("an in-process generator is 'hf'; set generator.service=true for vllm")
    from forge_env.generation import make_generator

    model, tokenizer = load_model_and_tokenizer(config.model.path, device=gen.device, seed=config.model.seed)
    generator = make_generator("hf", model=model, tokenizer=tokenizer, config=gen.config)
    closers.append(generator.aclose)
    return generator, tokenizer


async def run_gateway(config: GatewayAppConfig, announce: Any = print) -> None:
    from agents.gateway.app import GatewayServer, GatewayServeSettings
    from agents.gateway.core import AgentGateway, GatewayConfig
    from forge_env.chat import ChatRenderer
    from forge_env.generation.base import SamplingParams

    closers: list[Any] = []
    try:
        generator, tokenizer = await build_generator(config, closers)
        rc = config.renderer
        renderer = ChatRenderer(tokenizer, parser=rc.parser, chat_template=rc.chat_template, strict=rc.strict,
                                reasoning=rc.reasoning, check_drift=rc.check_drift)
        s = config.sampling
        limits = config.gateway
        gateway = AgentGateway(generator, renderer, GatewayConfig(
            model_name=limits.model_name, max_episodes=limits.max_episodes, episode_ttl_s=limits.episode_ttl_s,
            max_tokens=s.max_tokens, auto_open=limits.auto_open, max_calls_per_episode=limits.max_calls_per_episode,
            tool_choice_retries=limits.tool_choice_retries, default_sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                            max_tokens=s.max_tokens)))
        closers.append(gateway.aclose)
        settings = GatewayServeSettings(token=os.environ.get(TOKEN_ENV_VAR) or None,
                                        admin_token=os.environ.get(ADMIN_TOKEN_ENV_VAR) or None,
                                        max_body_bytes=int(config.serve.max_body_mb * 1024 * 1024),
                                        trajectories_path=config.trajectories)
        server = GatewayServer(gateway, settings, host=config.serve.host, port=config.serve.port,
                               header_timeout_s=config.serve.header_timeout_s)
        await server.start()
        announce(f"forge-env gateway: {config.model.path} on {server.base_url} (episode base URL "
                 f"{server.base_url}/e/<episode id>/v1; admin routes {'on' if settings.admin_token else 'off'})",
                 flush=True)
        await server.wait()
    finally:
        for close in reversed(closers):
            try:
                await close()
            except Exception:  # best-effort on the way out
                pass


def gateway_command(args: argparse.Namespace) -> int:
    from forge_env.openenv.server import is_loopback

    config = load_gateway_config(args.config, args.overrides)
    if not is_loopback(config.serve.host) and not os.environ.get(TOKEN_ENV_VAR):
        print(f"forge-env gateway: warning: binding {config.serve.host} without a token; anyone who can reach this "
              f"port can sample from the model (set ${TOKEN_ENV_VAR})", file=sys.stderr, flush=True)
    asyncio.run(run_gateway(config))
    return 0
