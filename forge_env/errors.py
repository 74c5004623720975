"""``InfraError``: the one base of every failure of the machine rather than the policy.

An episode that ends in an ``InfraError`` says nothing about the model: ``TextEnv.astep`` does
not turn one raised by a tool or by the grading into an observation or a reward (it ends the
episode and re-raises it), and the rollout loop marks the episode ``infra_error``, so training
drops it (and counts it in ``rollout/infra_failures``) instead of learning a 0 from it.

Which errors are the machine's fault (each derives from ``InfraError`` *and* keeps its old base,
so ``except RuntimeError`` / ``except ServiceError`` / ``except GenerationError`` still catch it):

- sandbox (``forge_env.sandbox.base``): ``SandboxError`` and all its subclasses: isolation that
  cannot be set up (``SandboxUnavailableError``), a sandbox closed or too busy under the episode
  (``SandboxClosedError``, ``SandboxBusyError``), a worker that cannot answer (``WorkerFailure``).
  The code the sandbox runs cannot raise these in the host: its own failures are ``ExecResult`` s.
  ``InvalidFilesError`` (a bad ``files`` mapping) is the caller's bug and is not one.
- services (``forge_env.services.errors``): ``ReplicaFailedError`` (a replica died under the call),
  ``SessionLostError`` (its replica died, or the session expired), ``NoHealthyReplicaError``,
  ``ServiceOverloadedError`` (a replica's queue is full: the deployment could not take the call) and
  ``HostUnreachableError``. Not the machine's fault, so not ``InfraError``: ``SessionLimitError``
  (the caller holds too many sessions; ``EnvCapacityError`` derives from it), ``ServiceClosedError``
  (the caller shut the service down) and ``ReplicaSpawnError`` in general (a ``setup()`` that raises or
  a request for more GPUs than the host has is a bug or a configuration error; only its subclass
  ``HostUnreachableError`` is the machine).
- model endpoints (``forge_env.generation.endpoints``): ``EndpointError`` (the endpoint failed after its
  retries; the model was never asked). The rollout keeps its own accounting for it: ``status="error"``
  with ``error_kind="endpoint"``, which evaluation counts apart from model failures.
- tools and graders raise ``InfraError`` itself (a sandbox run killed for ``sandbox_error``, a tool that
  outlived its own deadline plus grace).

Graded code must not be able to raise one of these from inside its run: that would turn its failure
into a masked episode. Keep it so when adding a subclass.
"""

from __future__ import annotations


class InfraError(RuntimeError):
    """The machine failed, not the policy: a sandbox that broke, a dead replica, a tool that outlived its deadline.

    Raised by a tool or by an environment's grading, it is not turned into an error message
    or a reward: ``TextEnv.astep`` ends the episode and re-raises it, and the rollout marks the
    episode ``infra_error`` so training drops it (and counts it) instead of learning a 0 from it.
    See this module's docstring for which library errors derive from it.
    """


__all__ = ["InfraError"]
