"""VerifiersEnv: a verifiers 0.4 taskset played as a forge-env TextEnv.

What maps (docs/ecosystem.md has the whole table):

* rows -> tasks: the taskset's tasks (``Taskset.load()``, in order, ``idx`` set) become forge-env task dicts,
  the ``TaskData`` as JSON plus ``task_id``; ``reset(options={"task": row})`` takes such a dict back;
* prompt -> opening messages: ``system_prompt`` as a system message, then ``prompt`` (text or messages), as
  verifiers' chat (``null``) harness sends them;
* tools -> tools: ``Taskset.toolsets`` (one instance for the env) and ``Task.toolsets`` (one per episode),
  each ``@vf.tool`` as a forge-env tool named ``<server>_<tool>`` as verifiers' harness names it
  (:mod:`environments.verifiers_env.tools`);
* rewards -> reward: the episode ends on a reply without tool calls, as verifiers' chat loop does; the
  conversation is recorded as a verifiers ``Trace`` and scored by ``Task.score`` (``@vf.reward`` weighted sum,
  ``@vf.metric`` and ``reward/<name>`` as metrics). An episode cut short by ``max_turns`` or a budget is
  scored too (verifiers scores every finished rollout), with the reward on the truncating step;
* ``@vf.stop`` hooks end the episode (``terminated``, then scored) when one fires after a turn's tool results.
"""

from __future__ import annotations

import asyncio
from typing import Any

from environments.verifiers_env import trace as traces
from environments.verifiers_env.loading import VerifiersEnvError, import_vf, refuse_runtime_tasks
from environments.verifiers_env.tools import SharedState, forge_tools
from forge_env import EpisodeEnd, EpisodeState, Message, TaskError, TextEnv, Verdict
from forge_env.tools import Tool

NO_PROMPT = "the user opens such a task, and forge-env has no simulated user (a policy plays the assistant only)"


class VerifiersEnv(TextEnv):
    """A verifiers 0.4 ``vf.Taskset`` as a TextEnv (``forge_env.make("verifiers:<taskset-id>", ...)`` builds one).

    Args:
        taskset: the taskset instance (``vf.load_taskset(...)``, or any ``vf.Taskset`` built in code).
        limit: play only the first ``limit`` tasks (needed for an infinite taskset).
        name: the id shown in task ids (default: the taskset config's ``id`` or the class name).
        **kwargs: :class:`~forge_env.TextEnv` options (``max_turns`` defaults to 10; ``parallel_tool_calls`` to
            False, as verifiers' harness calls tools one at a time).
    """

    def __init__(self, taskset: Any, *, limit: int | None = None, name: str | None = None, **kwargs: Any):
        vf = import_vf()
        if not isinstance(taskset, vf.Taskset):
            raise TypeError(f"VerifiersEnv needs a verifiers.v1 Taskset, got {type(taskset).__name__}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be a positive number of tasks, got {limit}")
        if limit is None and not taskset.bounded:
            raise ValueError(f"{type(taskset).__name__} is infinite: pass limit=<number of tasks>")
        self.taskset = taskset if limit is None else taskset.take(limit)
        self.name = name or getattr(taskset.config, "id", "") or type(taskset).__name__
        vf_tasks = list(self.taskset)
        if not vf_tasks:
            raise ValueError(f"verifiers taskset {self.name!r} yielded no tasks")
        refuse_runtime_tasks(vf_tasks[0], self.name)  # hooks are the task class's: one type per taskset
        unopened = [t.data.idx for t in vf_tasks if t.data.prompt is None]
        if unopened:
            raise VerifiersEnvError(f"verifiers taskset {self.name!r}: tasks {unopened[:5]} have no prompt; {NO_PROMPT}")
        self._by_key = {vf_task.key: vf_task for vf_task in vf_tasks}
        self._template = vf_tasks[0]
        self._shared_servers = list(type(taskset).toolsets(taskset.config))
        self._shared_ready: asyncio.Lock | None = None
        self._shared_setup_done = False
        kwargs.setdefault("max_turns", 10)
        # verifiers' chat harness runs a turn's tool calls one after another, and tools replace the shared state
        # whole (last write wins): concurrent calls would lose each other's state updates.
        kwargs.setdefault("parallel_tool_calls", False)
        super().__init__(tasks=[self._row(t) for t in vf_tasks], **kwargs)

    @property
    def vf(self) -> Any:
        """``verifiers.v1`` (not kept on the instance: a module does not deep-copy, and check_env copies envs)."""
        import verifiers.v1 as vf

        return vf

    # ------------------------------------------------------------------ rows <-> tasks
    def _row(self, vf_task: Any) -> dict[str, Any]:
        whole = vf_task.data.model_dump(mode="json", exclude_none=True)
        row = {k: whole[k] for k in vf_task.data.model_dump(exclude_defaults=True) if k in whole}  # fields set
        row["task_id"] = f"{self.name}/{vf_task.data.id if vf_task.data.id is not None else vf_task.data.idx}"
        return row

    def _vf_task(self, row: dict[str, Any]) -> Any:
        from pydantic import ValidationError

        fields = {k: v for k, v in row.items() if k != "task_id"}
        try:
            data = type(self._template.data).model_validate(fields)
        except ValidationError as exc:
            raise TaskError(f"not a row of verifiers taskset {self.name!r}: {exc}") from None
        known = self._by_key.get(type(self._template)(data, self._template.config).key)
        return known if known is not None else type(self._template)(data, self._template.config)

    def validate_task(self, task: Any) -> dict[str, Any]:
        task = super().validate_task(task)
        self._vf_task(task)
        return task

    # ------------------------------------------------------------------ the episode
    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        data = self._vf_task(task).data
        if data.prompt is None:
            raise TaskError(f"{task.get('task_id')}: {NO_PROMPT}")
        opening: list[Message] = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            return [*opening, {"role": "user", "content": data.prompt}]
        return [*opening, *(traces.forge_message(self.vf, m) for m in data.prompt)]

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        vf_task = self._vf_task(state.task)
        holder = SharedState(traces.new_state(vf_task))
        own = list(type(vf_task).toolsets(vf_task.config))
        state.data.update(vf_task=vf_task, shared_state=holder, own_servers=own)
        return forge_tools([*self._shared_servers, *own], holder)

    async def setup_episode(self, state: EpisodeState) -> None:
        if self._shared_ready is None:
            self._shared_ready = asyncio.Lock()
        async with self._shared_ready:
            if not self._shared_setup_done:
                for server in self._shared_servers:
                    await server.setup()
                self._shared_setup_done = True
        vf_task = state.data["vf_task"]
        for server in state.data["own_servers"]:
            await server.setup()
            await server.setup_task(vf_task)
        trace = self._trace(state)
        await vf_task.setup(trace, None)
        state.data["shared_state"].state = trace.state

    async def teardown_episode(self, state: EpisodeState) -> None:
        for server in state.data.get("own_servers", []):
            await server._exit_stack.aclose()  # what verifiers' server closes when its process ends

    async def aclose(self) -> None:
        await super().aclose()
        if self._shared_setup_done:
            self._shared_setup_done = False
            for server in self._shared_servers:
                await server._exit_stack.aclose()

    def _trace(self, state: EpisodeState) -> Any:
        specs = [tool.spec for tool in self._episode_tools.values()]
        opening = len(self.initial_messages(state.task))
        return traces.record(self.vf, state.data["vf_task"], state.data["shared_state"].state, state.messages, specs,
                             opening)

    async def grade_episode(self, state: EpisodeState, end: EpisodeEnd) -> Verdict:
        """Score the recorded ``Trace`` with ``Task.score`` however the episode ends (a stop hook's name is the
        trace's stop condition and ``info["stop_condition"]``)."""
        trace = self._trace(state)
        if end.kind == "stop":
            trace.stop(end.reason)
        vf_task = state.data["vf_task"]
        await vf_task.finalize(trace, None)
        reward, metrics = await traces.score(trace, vf_task)
        state.data["trace"] = trace
        return Verdict(reward=reward, metrics=metrics, info={"stop_condition": end.reason} if end.kind == "stop" else {})

    async def stop_condition(self, state: EpisodeState) -> str | None:
        return await self._fired_stop(state)

    async def _fired_stop(self, state: EpisodeState) -> str | None:
        """The name of the first ``@vf.stop`` hook that fires after this turn, if any (verifiers' own dispatch:
        a hook takes the ``Trace``, the next ``Request`` or the last ``Response``)."""
        vf_task = state.data["vf_task"]
        hooks = vf_task.hooks("stop")
        if not hooks:
            return None
        from verifiers.v1.session import call_hook

        trace = self._trace(state)
        vf = self.vf
        typed = [traces.vf_message(vf, m) for m in state.messages]
        tools = [vf.Tool(**tool.spec["function"]) for tool in self._episode_tools.values()]
        replies = [m for m in typed if m.role == "assistant"]
        available = {vf.Trace: trace, vf.Request: vf.Request(messages=typed, tools=tools or None)}
        if replies:
            available[vf.Response] = vf.Response(id="last", created=0, model="forge-env", message=replies[-1],
                                                 finish_reason="tool_calls" if replies[-1].tool_calls else "stop")
        for fn in hooks:
            if await call_hook(fn, available):
                return fn.__name__
        return None
