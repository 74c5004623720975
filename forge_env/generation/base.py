"""The generator contract: sampling parameters, completions, and the ``Generator`` protocol.

Token in, token out. A generator takes prompt token ids and returns the sampled token ids verbatim with
one sampler logprob per token, so rollouts stay token-exact. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from forge_env.weights.errors import WeightSourceError
from forge_env.weights.source import WeightSource
from forge_env.weights.source import fetch_weights as _fetch_weights

FinishReason = Literal["stop", "length", "abort"]


async def fetch_weights(source: WeightSource, version: int) -> Any:
    """The weights of ``version`` from ``source`` (``forge_env.weights.fetch_weights``); a source that is
    not one raises ``WeightUpdateError``."""
    try:
        return await _fetch_weights(source, version)
    except WeightSourceError as exc:
        raise WeightUpdateError(str(exc)) from exc


class GenerationError(RuntimeError):
    """Base class for generator failures."""


class SamplingParamsError(ValueError):
    """Sampling parameters are out of range or inconsistent."""


class PromptTooLongError(ValueError):
    """The prompt does not fit in the model's context window."""


class GeneratorClosedError(GenerationError):
    """The generator was closed; create a new one."""


class WeightUpdateError(GenerationError):
    """New weights could not be loaded (no weight source, older version, mismatched parameters)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` disable those filters.
    Generation stops at the model's end-of-turn tokens (unless ``ignore_eos``), at any of
    ``stop_token_ids`` (kept in ``token_ids``), at any of the ``stop`` strings (the tokens that complete the
    string are kept in ``token_ids``; ``text`` is cut before the string unless
    ``include_stop_str_in_output``), or after ``max_tokens`` tokens. ``seed`` makes sampling reproducible;
    ``n`` completions of one prompt use seeds ``seed, seed + 1, ...``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and stored as tuples so the params stay hashable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise SamplingParamsError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise SamplingParamsError(f"n must be >= 1, got {self.n}")
        if any(not s for s in self.stop):
            raise SamplingParamsError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def derived(self, *keys: int | str) -> SamplingParams:
        """These params with a seed derived from this seed and ``keys`` (unchanged when unseeded).

        Used to give every (round, group, episode, turn) its own reproducible random stream.
        """
        return self if self.seed is None else replace(self, seed=derive_seed(self.seed, *keys))

    def for_sample(self, index: int) -> SamplingParams:
        """The params of the ``index``-th of ``n`` samples: ``n=1`` and seed ``seed + index``."""
        seed = None if self.seed is None else self.seed + index
        return SamplingParams(**{**asdict(self), "n": 1, "seed": seed})


def derive_seed(seed: int, *keys: int | str) -> int:
    """A seed in ``[0, 2**31)`` determined by ``seed`` and ``keys``: distinct keys give independent streams.

    A hash, not ``seed + index``: consecutive bases plus small offsets would make different
    groups share seeds (group A's episode 1 = group B's episode 0).
    """
    text = json.dumps([int(seed), *keys], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % (2**31)


@dataclass
class Completion:
    """One generated completion.

    ``token_ids`` are the sampled tokens verbatim (including a final stop token); ``logprobs[i]`` is the
    sampler's logprob of ``token_ids[i]``; ``num_cached_tokens`` counts prompt tokens whose KV cache was
    reused instead of prefilled; ``policy_version`` is the weight version that produced every token.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int
    num_cached_tokens: int = 0
    stop_reason: int | str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Completion:
        return cls(**data)


@runtime_checkable
class Generator(Protocol):
    """What rollouts need from a generation backend (HF, vLLM, or a service of either)."""

    @property
    def policy_version(self) -> int:
        """The version of the weights currently loaded."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        """Sample one completion of ``prompt_ids``; calls with one ``session_id`` reuse that session's KV cache."""
        ...

    async def update_weights(self, version: int) -> None:
        """Load weights ``version`` from the weight source and drop session caches (unless configured to keep)."""
        ...

    async def release_session(self, session_id: str) -> None:
        """Forget a session's KV cache (an episode ended). Unknown ids are ignored."""
        ...


class GeneratorBase:
    """Shared behaviour of the generator backends: ``generate_n``, versioned ``update_weights``.

    Subclasses provide ``generate``, ``load_state_dict(weights, version)``, ``weight_source`` and ``_version``.
    """

    weight_source: WeightSource | None = None
    _version: int = 0

    @property
    def policy_version(self) -> int:
        """The version of the weights currently loaded."""
        return self._version

    async def generate_n(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[Completion]:
        """``sampling.n`` independent completions of one prompt (seeds ``seed, seed + 1, ...``), concurrently."""
        import asyncio

        samples = (self.generate(prompt_ids, sampling.for_sample(i)) for i in range(sampling.n))  # type: ignore[attr-defined]
        return list(await asyncio.gather(*samples))

    async def update_weights(self, version: int) -> None:
        """Fetch weights ``version`` from ``weight_source`` and load them (``load_state_dict``)."""
        if self.weight_source is None:
            raise WeightUpdateError(
                f"no weight_source configured; pass one to {type(self).__name__} or call load_state_dict"
            )
        self._check_version(version)
        weights = await fetch_weights(self.weight_source, version)
        await self.load_state_dict(weights, version)  # type: ignore[attr-defined]

    @staticmethod
    def _one_sample(sampling: SamplingParams | None) -> SamplingParams:
        """``sampling`` (default params for None), refusing ``n > 1`` in ``generate``."""
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise SamplingParamsError("generate() returns one completion; use generate_n() for n > 1")
        return sampling

    def _check_version(self, version: int) -> None:
        if version < self._version:
            raise WeightUpdateError(
                f"weight version {version} is older than the loaded version {self._version}"
            )
