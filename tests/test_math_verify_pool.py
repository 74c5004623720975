"""The verifier process pool: real worker processes, real hangs in sympy, real kills."""

from __future__ import annotations

import asyncio
import errno
import os
import signal

import pytest

from environments.math.verify import VerifierClosedError, VerifierPool, VerifierUnavailableError

# sympy tries to build this number: it hangs (and eats memory) until its worker is killed.
HANGING_REPLY = "so the value is \\boxed{2^{2^{40}}}"


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, deadline_s=30) as p:
        yield p


@pytest.fixture
def fast_deadline_pool():
    with VerifierPool(num_workers=2, deadline_s=1.0) as p:
        yield p


async def test_pool_scores_equivalent_one_and_wrong_zero(pool: VerifierPool) -> None:
    pairs = [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("The answer is $1,000.", "1000"),
        ("#### 72", "work\n#### 72"),
        ("\\boxed{50\\%}", "0.5"),
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("The answer is 73.", "72"),
    ]
    verdicts = await pool.verify_many(pairs)
    assert [v.correct for v in verdicts] == [True, True, True, True, False, False]
    assert [v.status for v in verdicts][-2:] == ["wrong", "wrong"]
    assert verdicts[0].marked and verdicts[0].source == "boxed"


def test_sync_form_works_from_a_thread(pool: VerifierPool) -> None:
    verdict = pool.verify_sync("She has 12 apples", "12")
    assert verdict.correct and not verdict.marked


async def test_hanging_check_is_killed_and_pool_keeps_serving(fast_deadline_pool: VerifierPool) -> None:
    pool = fast_deadline_pool
    pool.start()
    pids_before = set(pool.worker_pids)
    hang = asyncio.create_task(pool.verify(HANGING_REPLY, "1"))
    quick = await pool.verify("#### 18", "18")  # the other worker answers while one is stuck
    assert quick.correct
    ticks = 0
    while not hang.done():  # the event loop keeps running while the check hangs
        await asyncio.sleep(0.01)
        ticks += 1
    verdict = await hang
    assert verdict.status == "timeout" and not verdict.correct
    assert "deadline" in verdict.detail
    assert ticks > 5
    assert pool.stats["timeouts"] == 1 and pool.stats["restarts"] == 1
    assert set(pool.worker_pids) != pids_before and len(pool.worker_pids) == 2
    for pid in pids_before - set(pool.worker_pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the killed worker is gone (and reaped)
    results = await pool.verify_many([("#### 3", "3"), ("#### 4", "4"), ("#### 5", "6")])
    assert [v.correct for v in results] == [True, True, False]


async def test_worker_dying_mid_check_or_while_idle_is_replaced() -> None:
    with VerifierPool(num_workers=2, deadline_s=60) as pool:
        await pool.verify_many([("1", "1"), ("2", "2")])  # both workers up
        hang = asyncio.create_task(pool.verify(HANGING_REPLY, "1"))
        while sum(w.taken for w in pool._workers) < 3:  # a worker has taken the hang
            await asyncio.sleep(0.01)
        killed = pool.worker_pids
        for pid in killed:  # one is stuck in the check, the other idle
            os.kill(pid, signal.SIGKILL)
        verdict = await hang
        assert verdict.status == "worker_crashed" and "exited" in verdict.detail
        verdicts = await pool.verify_many([("#### 7", "7"), ("#### 8", "8")])
        assert [v.status for v in verdicts] == ["correct", "correct"]
        assert pool.stats["restarts"] >= 2 and len(pool.worker_pids) == 2
        assert pool.stats["crashes"] == 1  # the hang's worker; the idle one died before taking a check


async def test_a_check_handed_to_a_worker_killed_while_idle_but_not_yet_exited_goes_to_a_fresh_one() -> None:
    # A SIGKILLed process can take a moment to exit; until it has, poll() says it is alive and the pool hands it
    # the next check. The check never ran, so it must not come back worker_crashed (a wrong 0 for a right
    # answer): it failed the full suite that way once. poll() is held at "alive" to make that moment last.
    with VerifierPool(num_workers=1, deadline_s=60) as pool:
        assert (await pool.verify("#### 1", "1")).correct
        (worker,) = pool._workers
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait()
        worker.proc.poll = lambda: None  # type: ignore[method-assign]
        verdict = await pool.verify("#### 2", "2")
        assert verdict.status == "correct", verdict
        assert pool.stats["handoff_retries"] == 1 and pool.stats["crashes"] == 0 and pool.worker_pids != [worker.pid]


async def test_a_worker_that_dies_in_a_check_it_took_is_worker_crashed_and_not_retried() -> None:
    # The worker said it took the check before dying: the check's doing, graded once (a retry would let a hostile
    # reply kill workers over and over). Here it dies of a SIGKILL in the middle of a hanging check.
    with VerifierPool(num_workers=1, deadline_s=60) as pool:
        hang = asyncio.create_task(pool.verify(HANGING_REPLY, "1"))
        while not pool._workers:
            await asyncio.sleep(0.01)
        (worker,) = pool._workers
        while worker.taken < 1:  # it said it took the check: sympy is at work on it
            await asyncio.sleep(0.01)
        os.kill(worker.pid, signal.SIGKILL)
        verdict = await hang
        assert verdict.status == "worker_crashed" and pool.stats["handoff_retries"] == 0
        assert pool.stats["crashes"] == 1


async def test_oversized_input_is_rejected_with_a_reason() -> None:
    with VerifierPool(num_workers=1, max_input_chars=100) as pool:
        verdict = await pool.verify("x" * 101 + " \\boxed{1}", "1")
        assert verdict.status == "too_long" and not verdict.correct
        assert "over the cap of 100" in verdict.detail and "max_input_chars" in verdict.detail
        assert pool.stats["checks"] == 0  # never reached a worker


async def test_an_exception_in_the_check_is_an_error_verdict() -> None:
    # json.loads on the payload dict raises TypeError inside the worker, which survives it.
    with VerifierPool(num_workers=1, target="json:loads", preload=()) as pool:
        pid = pool.worker_pids[0]
        verdict = await pool.verify("1", "1")
        assert verdict.status == "error" and "TypeError" in verdict.detail
        assert pool.worker_pids == [pid]


async def test_bad_arguments_and_closed_pool() -> None:
    pool = VerifierPool(num_workers=1)
    with pytest.raises(TypeError, match="must be str"):
        await pool.verify(None, "1")  # type: ignore[arg-type]
    pool.close()
    with pytest.raises(VerifierClosedError):
        await pool.verify("1", "1")
    with pytest.raises(ValueError, match="num_workers"):
        VerifierPool(num_workers=0)


async def test_closing_the_pool_releases_checks_in_flight_and_waiting() -> None:
    pool = VerifierPool(num_workers=1, deadline_s=60)
    await pool.verify("1", "1")
    running = asyncio.create_task(pool.verify(HANGING_REPLY, "1"))
    while pool.stats["checks"] < 2:
        await asyncio.sleep(0.01)
    waiting = asyncio.create_task(pool.verify("2", "2"))  # no idle worker: it waits
    await asyncio.sleep(0.05)
    pool.close()
    assert (await running).status == "worker_crashed"
    with pytest.raises(VerifierClosedError):
        await waiting
    assert pool.worker_pids == []


async def test_a_worker_that_cannot_be_started_is_an_infra_error_and_the_slot_comes_back() -> None:
    # The machine refusing a new process is not the reply's doing: the check raises an InfraError (the episode is
    # dropped, not graded 0). Before, the replacement's OSError escaped and its slot was lost: with one worker,
    # every later check waited for ever. The refusal is real: this process may open no new file, so Popen's
    # pipes fail with EMFILE (a process limit would not bind root, which CI runs as).
    import resource

    from forge_env.errors import InfraError

    with VerifierPool(num_workers=1, deadline_s=60) as pool:
        assert (await pool.verify("#### 1", "1")).correct
        (worker,) = pool._workers
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # only stdin, stdout and stderr may be opened
        try:
            for _ in range(2):  # the second check finds the slot again (it does not wait for ever)
                with pytest.raises(VerifierUnavailableError, match="no verifier worker could be started") as raised:
                    await asyncio.wait_for(pool.verify("#### 2", "2"), timeout=120)
                assert isinstance(raised.value, InfraError) and raised.value.__cause__.errno == errno.EMFILE
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert pool.stats["spawn_failures"] == 3 and pool.worker_pids == []
        verdict = await asyncio.wait_for(pool.verify("#### 3", "3"), timeout=120)
        assert verdict.status == "correct" and len(pool.worker_pids) == 1
