"""The worker-pool core shared by the sandbox pool and the math verifier pool, with fake workers."""

from __future__ import annotations

import asyncio
import threading

import pytest

from forge_env.sandbox.slots import AsyncWorkerSlots, ThreadWorkerSlots


class Closed(RuntimeError):
    pass


class FakeWorker:
    def __init__(self, n: int) -> None:
        self.n, self.alive, self.killed = n, True, False


def _thread_slots(size=1, fail=lambda: False, respawn="lazy"):
    made: list[FakeWorker] = []

    def spawn() -> FakeWorker:
        if fail():
            raise OSError("no process")
        made.append(FakeWorker(len(made)))
        return made[-1]

    def kill(worker: FakeWorker) -> None:
        worker.killed = True

    slots = ThreadWorkerSlots(size, spawn=spawn, kill=kill, usable=lambda w: w.alive, closed_error=Closed,
                              respawn=respawn)
    return slots, made


def test_a_dead_worker_is_replaced_before_use_and_eager_respawn_starts_the_successor_at_once():
    slots, made = _thread_slots(respawn="eager")
    slot = slots.take_sync()
    first = slots.ensure(slot)
    first.alive = False
    second = slots.ensure(slot)
    assert first.killed and second is made[1] and slots.live == {second}
    slots.replace(slot)  # a failure: killed, and its successor started now (eager)
    assert second.killed and slot.worker is made[2]
    slots.give(slot)


def test_a_spawn_failure_keeps_the_slot_for_the_next_taker():
    failing = [True]
    slots, made = _thread_slots(fail=lambda: failing[0])
    for _ in range(2):  # one slot: a second taker finds it again instead of waiting for ever
        slot = slots.take_sync()
        with pytest.raises(OSError):
            slots.ensure(slot)
        assert slot.worker is None
        slots.give(slot)
    failing[0] = False
    slot = slots.take_sync()
    assert slots.ensure(slot) is made[0]
    slots.give(slot)


def test_closing_fails_waiting_threads_and_coroutines_and_returns_the_workers():
    slots, made = _thread_slots()
    slot = slots.take_sync()
    slots.ensure(slot)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            slots.take_sync()
        except Closed as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    while not slots.waiting:
        pass

    async def main() -> None:
        task = asyncio.ensure_future(slots.take())
        while slots.waiting < 2:
            await asyncio.sleep(0.001)
        assert slots.close() == [made[0]]
        with pytest.raises(Closed):
            await task

    asyncio.run(main())
    waiter.join(5)
    assert len(raised) == 1 and slots.live == set() and slot.worker is None
    with pytest.raises(Closed):
        slots.take_sync()


async def test_async_slots_hand_out_fifo_and_spawn_lazily():
    started: list[FakeWorker] = []

    async def spawn() -> FakeWorker:
        started.append(FakeWorker(len(started)))
        return started[-1]

    async def kill(worker: FakeWorker) -> None:
        worker.killed = True

    slots = AsyncWorkerSlots(1, spawn=spawn, kill=kill, usable=lambda w: w.alive, closed_error=Closed)
    slot = await slots.take()
    order: list[int] = []

    async def queued(i: int) -> None:
        taken = await slots.take()
        order.append(i)
        slots.give(taken)

    waiters = [asyncio.ensure_future(queued(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    worker = await slots.ensure(slot)
    await slots.replace(slot)  # lazy: killed, and the slot stays empty for its next taker
    assert worker.killed and slot.worker is None
    slots.give(slot)
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2] and len(started) == 1
    await slots.fill()
    assert len(started) == 2 and slots.live == {started[1]}
