"""A vLLM worker extension that can be told to fail the next weight load half way (tests only).

Loaded by vLLM inside its worker process through ``VLLMGeneratorConfig(worker_extension_cls=...)``; it
behaves exactly like ``ForgeWorkerExtension`` until ``collective_rpc("forge_fail_next_load", args=(n,))``
arms it, after which the next load raises once ``n`` tensors have gone into the live model.
"""

from forge_env.generation.vllm_worker import ForgeWorkerExtension

EXTENSION = "tests.vllm_faults.FaultInjectingWorkerExtension"


class FaultInjectingWorkerExtension(ForgeWorkerExtension):
    def forge_fail_next_load(self, after_tensors: int) -> None:
        self._fail_after = after_tensors

    def _forge_weights(self, weights):
        fail_after, self._fail_after = getattr(self, "_fail_after", None), None
        for index, item in enumerate(super()._forge_weights(weights)):
            if index == fail_after:
                raise OSError(f"injected failure after {index} tensors")
            yield item
