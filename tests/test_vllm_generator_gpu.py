"""VLLMGenerator on CUDA (the ``gpu`` extra's vLLM wheel): the CPU module's checks, on a GPU.

What only a GPU exercises: the CUDA worker, memory as a fraction of the GPU, CUDA graphs (not eager), and
tensor parallelism (every rank maps the same weights file and loads its shard). Skipped without CUDA.
"""


import pytest
import pytest_asyncio
import torch

from forge_env.models import save_tiny_model
from tests.vllm_checks import (
    assert_serves,
    check_bad_weights_are_refused,
    check_four_updates,
    check_rollback_of_a_failed_load,
    check_sessions_and_cache_reset,
)
from tests.vllm_faults import EXTENSION

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
    pytest.mark.asyncio(loop_scope="module"),
]
BLOCK = 16
# CUDA kernels (fp32 attention paths, reductions in another order) drift further from transformers' CPU
# forward pass than vLLM's CPU kernels do.
ATOL = 1e-3


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=[1, 2], ids=["tp1", "tp2"])
async def generator(request, tmp_path_factory):
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig

    tensor_parallel = request.param
    if torch.cuda.device_count() < tensor_parallel:
        pytest.skip(f"needs {tensor_parallel} GPUs")
    checkpoint = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    config = VLLMGeneratorConfig(model=str(checkpoint), device="cuda", dtype="float32", max_model_len=1024,
                                 gpu_memory_utilization=0.3, block_size=BLOCK, tensor_parallel_size=tensor_parallel,
                                 worker_extension_cls=EXTENSION)
    assert "kv_cache_memory_bytes" not in config.engine_args() and not config.engine_args()["enforce_eager"]
    gen = VLLMGenerator(config)
    yield gen
    gen.close()


async def test_samples_with_the_sampler_logprobs_of_the_checkpoint(generator):
    await assert_serves(generator, 0, atol=ATOL)


async def test_four_updates_in_a_row_serve_exactly_the_new_weights(generator, tmp_path):
    await check_four_updates(generator, tmp_path, first=generator.policy_version + 1, atol=ATOL)


async def test_weights_that_do_not_fit_are_refused_and_nothing_changes(generator, tmp_path):
    await check_bad_weights_are_refused(generator, tmp_path, atol=ATOL)


async def test_a_load_that_fails_half_way_is_rolled_back(generator):
    await check_rollback_of_a_failed_load(generator, atol=ATOL)


async def test_sessions_reuse_whole_blocks_and_updates_reset_the_cache(generator):
    await check_sessions_and_cache_reset(generator, BLOCK)
