"""Where an evaluation's model runs: in this process (``--local``), behind a token-level ``/v1/completions``
server (``--api completions``, trajectories token-exact), or behind a chat API (``--api chat``, message level).

Each backend plays one planned episode and closes cleanly; ``decode`` renders token ids for the HTML view
(``None`` for message-level runs, whose view shows the messages).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.eval.runner import PlannedEpisode
from agents.groups import EnvFactory, close_env, make_env, play_one
from agents.message_rollout import run_message_episode
from agents.rollout import EpisodeBudget
from agents.trajectory import LEVEL_MESSAGE, LEVEL_TOKEN, Trajectory
from forge_env.generation.base import SamplingParams


@dataclass
class Backend:
    """A model ready to play planned episodes."""

    level: str
    describe: str
    play: Callable[[PlannedEpisode], Awaitable[Trajectory]]
    close: Callable[[], Awaitable[None]]
    decode: Callable[[list[int]], str] | None = None
    stats: Callable[[], dict[str, int]] = field(default=lambda: {})


def endpoint_config(args: argparse.Namespace) -> Any:
    """The ``EndpointConfig`` the flags describe (base URL from ``--base-url`` or ``$OPENAI_BASE_URL``)."""
    from forge_env.generation.endpoints import EndpointConfig

    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        raise ValueError("say where the model is: --base-url URL (or $OPENAI_BASE_URL), or --local PATH")
    return EndpointConfig(base_url=base_url, model=args.model, api_key_env=args.api_key_env,
                          timeout_s=args.timeout, max_retries=args.max_retries, backoff_s=args.backoff,
                          max_concurrency=args.concurrency, session_header=args.session_header or None)


def _tokenizer_for(args: argparse.Namespace) -> Any:
    from forge_env.models import TINY_MODEL_ID, load_tokenizer, resolve_model

    source = resolve_model(args.tokenizer or args.model)  # a model id or .gguf file: its checkpoint directory
    if not args.tokenizer and source != TINY_MODEL_ID and not Path(source).is_dir():
        raise ValueError(
            f"token-level eval renders prompts itself and needs the model's tokenizer and chat template: "
            f"--model {source!r} is not a local checkpoint, so pass --tokenizer PATH (or use --api chat)")
    return load_tokenizer(source)


async def build_backend(args: argparse.Namespace, env_factory: EnvFactory, sampling: SamplingParams,
                        budget: EpisodeBudget) -> Backend:
    """The backend the flags ask for (see the module docstring)."""
    def episode_sampling(planned: PlannedEpisode) -> SamplingParams:
        return dataclasses.replace(sampling, seed=planned.sampling_seed)

    if args.api == "chat":
        if args.local:
            raise ValueError("--api chat talks to an endpoint; drop --local, or use --api completions")
        from forge_env.generation.endpoints import ChatEndpoint

        client = ChatEndpoint(endpoint_config(args))

        async def play_chat(planned: PlannedEpisode) -> Trajectory:
            try:
                env = await make_env(env_factory)
            except Exception as exc:
                return Trajectory(episode_id=planned.episode_id, env_id=args.env_id, group_id=planned.group_id,
                                  seed=planned.env_seed, level=LEVEL_MESSAGE, status="error", error_kind="internal",
                                  error=f"could not create the environment: {type(exc).__name__}: {exc}")
            try:
                return await run_message_episode(
                    env, client, sampling=episode_sampling(planned), seed=planned.env_seed, budget=budget,
                    episode_id=planned.episode_id, group_id=planned.group_id, env_id=args.env_id)
            finally:
                await close_env(env)

        return Backend(LEVEL_MESSAGE, f"chat API {client.config.base_url} model {args.model}", play_chat,
                       client.aclose, stats=client.stats.as_dict)

    from forge_env.chat import ChatRenderer

    if args.local:
        from forge_env.generation import make_generator

        generator: Any = make_generator("hf", model=args.local, config={"max_batch_size": args.concurrency},
                                        device=args.device)
        tokenizer = generator.tokenizer
        describe, stats = f"in-process {args.local}", (lambda: {})
    else:
        from forge_env.generation import make_generator

        tokenizer = _tokenizer_for(args)
        generator = make_generator("completions", config=endpoint_config(args), vocab_size=len(tokenizer))
        describe, stats = f"completions {generator.config.base_url} model {args.model}", generator.stats.as_dict
    renderer = ChatRenderer(tokenizer)

    async def play_tokens(planned: PlannedEpisode) -> Trajectory:
        return await play_one(env_factory, generator, renderer, sampling=episode_sampling(planned),
                              seed=planned.env_seed, task=None, budget=budget, group_id=planned.group_id,
                              env_id=args.env_id, episode_id=planned.episode_id)

    return Backend(LEVEL_TOKEN, describe, play_tokens, generator.aclose,
                   decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False), stats=stats)
