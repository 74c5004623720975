"""What the agent gateway adds over calling the generator directly: calls/s and added latency p50/p99.

Each episode plays ``--turns`` calls: the direct side renders incrementally and calls ``generator.generate``
in the episode's session (what the rollout does); the gateway side sends the same conversation through the
``openai`` SDK to a gateway on 127.0.0.1 (HTTP, validation, capture, drift check, response). Added latency is
the gateway's per-call latency percentile minus the direct one, at each concurrency.

``--generator instant`` answers every call with a fixed short reply at once, so the figures are the gateway's
own cost; ``--generator tiny`` samples from the tiny model (generation time dominates and varies).

The client runs in the same process and event loop as the gateway, so its own cost is counted in: ``--client
raw`` (default) is a few lines of HTTP/1.1 over a keep-alive connection, the closest to the gateway's own cost;
``httpx`` and ``openai`` add what those libraries cost a harness.

    python -m benchmarks.gateway_bench [--generator instant|tiny] [--client raw|httpx|openai] [--concurrency 1 16 64]
                                       [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx
import openai

from agents.gateway import AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer
from forge_env.chat import ChatRenderer
from forge_env.generation.base import Completion, SamplingParams
from forge_env.models import build_byte_tokenizer


class InstantGenerator:
    """A generator that answers at once with the same few tokens (the gateway's own cost, nothing else)."""

    policy_version = 0

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer("All done.<|im_end|>", add_special_tokens=False)["input_ids"]

    async def generate(self, prompt_ids, sampling=None, session_id=None) -> Completion:
        return Completion(prompt_ids=list(prompt_ids), token_ids=list(self.ids), logprobs=[-0.1] * len(self.ids),
                          text="", finish_reason="stop", policy_version=0, num_cached_tokens=len(prompt_ids) // 2)

    async def release_session(self, session_id) -> None:
        pass


class RawClient:
    """A minimal keep-alive HTTP/1.1 JSON client on one asyncio connection per episode: the gateway's own cost,
    without an HTTP library's (httpx spends ~0.3 ms a request parsing the URL and building the request)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace") + (await self.reader.readexactly(length)).decode())
        return json.loads(await self.reader.readexactly(length))

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def direct_episode(generator, renderer, number: int, turns: int, sampling, latencies: list[float]) -> None:
    messages = [{"role": "user", "content": f"task {number}"}]
    ids = renderer.render_prompt(messages)
    for turn in range(turns):
        t0 = time.perf_counter()
        completion = await generator.generate(ids, sampling, session_id=f"direct-{number}")
        latencies.append(time.perf_counter() - t0)
        ids = ids + completion.token_ids
        ids = ids + renderer.render_continuation(ids, [{"role": "user", "content": f"go {turn}"}])
    await generator.release_session(f"direct-{number}")


async def gateway_episode(server, gateway, http, number: int, turns: int, latencies: list[float],
                          client: str = "httpx") -> None:
    """One episode through HTTP: ``raw`` (a connection of its own), ``httpx`` (``http``, a shared keep-alive
    client) or ``openai`` (the SDK, a client per episode)."""
    episode = f"bench-{number}-{time.monotonic_ns()}"
    api = openai.AsyncOpenAI(base_url=server.episode_url(episode), api_key="x", max_retries=0) \
        if client == "openai" else None
    raw = RawClient(server.host, server.port) if client == "raw" else None
    url = server.episode_url(episode) + "/chat/completions"
    path = f"/e/{episode}/v1/chat/completions"
    messages = [{"role": "user", "content": f"task {number}"}]
    for turn in range(turns):
        t0 = time.perf_counter()
        if raw is not None:
            reply = (await raw.post(path, {"model": "m", "messages": messages, "max_tokens": 16}))["choices"][0][
                "message"]
        elif api is None:
            answer = await http.post(url, json={"model": "m", "messages": messages, "max_tokens": 16})
            reply = answer.json()["choices"][0]["message"]
        else:
            response = await api.chat.completions.create(model="m", messages=messages, max_tokens=16)
            reply = response.choices[0].message.model_dump(exclude_none=True)
        latencies.append(time.perf_counter() - t0)
        messages += [reply, {"role": "user", "content": f"go {turn}"}]
    if api is not None:
        await api.close()
    if raw is not None:
        await raw.aclose()
    await gateway.finish(episode)


async def measure(args: argparse.Namespace) -> None:
    tokenizer = build_byte_tokenizer()
    if args.generator == "instant":
        generator = InstantGenerator(tokenizer)
    else:
        from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
        from forge_env.models import build_tiny_model

        generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=64))
    sampling = SamplingParams(temperature=1.0, max_tokens=16, seed=0)
    renderer = ChatRenderer(tokenizer)
    gateway = AgentGateway(generator, ChatRenderer(tokenizer), GatewayConfig(default_sampling=sampling))
    print(f"generator={args.generator} client={args.client} turns={args.turns} (latencies in ms)")
    print(f"{'episodes':>8} {'direct p50':>10} {'p99':>8} {'gateway p50':>11} {'p99':>8} {'added p50':>9} "
          f"{'added p99':>9} {'calls/s direct':>14} {'calls/s gateway':>15}")
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    http = httpx.AsyncClient(limits=limits, timeout=600) if args.client == "httpx" else None
    async with GatewayServer(gateway) as server:
        for concurrency in args.concurrency:
            direct: list[float] = []
            via: list[float] = []
            direct_s = via_s = 0.0
            for _ in range(args.repeat):  # interleaved, so a change of the machine's load hits both sides
                t0 = time.perf_counter()
                await asyncio.gather(*(direct_episode(generator, renderer, n, args.turns, sampling, direct)
                                       for n in range(concurrency)))
                direct_s += time.perf_counter() - t0
                t0 = time.perf_counter()
                await asyncio.gather(*(gateway_episode(server, gateway, http, n, args.turns, via, args.client)
                                       for n in range(concurrency)))
                via_s += time.perf_counter() - t0
            d50, d99, g50, g99 = (1e3 * percentile(direct, 0.5), 1e3 * percentile(direct, 0.99),
                                  1e3 * percentile(via, 0.5), 1e3 * percentile(via, 0.99))
            print(f"{concurrency:>8} {d50:>10.2f} {d99:>8.2f} {g50:>11.2f} {g99:>8.2f} {g50 - d50:>9.2f} "
                  f"{g99 - d99:>9.2f} {len(direct) / direct_s:>14.1f} {len(via) / via_s:>15.1f}")
    print(f"mean gateway call {1e3 * statistics.mean(via):.2f} ms at the last concurrency")
    if http is not None:
        await http.aclose()
    if hasattr(generator, "aclose"):
        await generator.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", choices=["instant", "tiny"], default="instant")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--client", choices=["raw", "httpx", "openai"], default="raw",
                        help="a minimal keep-alive HTTP/1.1 client (the gateway's own cost), a shared keep-alive httpx "
                             "client, or the openai SDK per episode (each adds its own cost to 'added')")
    parser.add_argument("--repeat", type=int, default=1,
                        help="episodes per concurrency slot, one after the other (more samples for the 1-episode p50)")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
