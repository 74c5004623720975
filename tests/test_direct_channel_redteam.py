"""Red team (issue 34, direct calls): what a process in the replica's network namespace can do to its socket.

The replica's socket is in the abstract namespace: no file permission guards it, and /proc/net/unix lists
its name to every process of that namespace (the sandbox's runs are not in it: bwrap and docker unshare the
network; runs of isolation='rlimits' and the host's helper processes, e.g. the math verifier's, are). Such a
process cannot call anything without the token, but it could connect and send nothing: a connection that
never finishes the token's frame must be hung up on, not kept (one replica fd each) for good.
"""

from __future__ import annotations

import asyncio

from forge_env.services import direct_channel
from forge_env.services.direct_channel import DirectChannel


class Actor:
    async def square(self, x: int) -> int:
        return x * x


def resolve(cls: type, name: str):
    return getattr(cls, name), True


async def test_a_connection_that_never_sends_the_token_is_hung_up_on(monkeypatch):
    monkeypatch.setattr(direct_channel, "GREETING_TIMEOUT_S", 0.2, raising=False)
    actor = Actor()
    address, token = await direct_channel.serve(actor, resolve)
    try:
        idle = [await asyncio.open_unix_connection(address) for _ in range(3)]
        idle[1][1].write(direct_channel.HEADER.pack(32) + token[:10])  # part of the greeting, then silence
        for reader, _ in idle:
            assert await asyncio.wait_for(reader.read(), 10) == b"", "the replica kept an idle caller's connection"
        honest = await DirectChannel.connect(address, token)  # a caller with the token is served as before
        assert await asyncio.wait_for(honest.call("square", (7,), {}), 30) == 49
        await asyncio.sleep(0.4)  # past the greeting's deadline: a trusted connection stays
        assert await asyncio.wait_for(honest.call("square", (8,), {}), 30) == 64
        honest.close()
        for _, writer in idle:
            writer.close()
    finally:
        actor._forge_direct_server.close()
