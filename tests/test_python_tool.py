"""The sandboxed `python` REPL tool (forge_env.sandbox.PythonREPL) that tool environments offer."""

from __future__ import annotations

import pytest

from forge_env.sandbox import PythonREPL
from forge_env.tools import ToolError
from tests.sandbox_support import requires_bwrap, strict_sandbox

pytestmark = requires_bwrap


@pytest.fixture
async def sandbox():
    sb = strict_sandbox(max_concurrency=1)
    yield sb
    await sb.close()


async def test_the_tool_keeps_state_and_reads_like_a_repl(sandbox):
    repl = PythonREPL(sandbox, timeout=2)
    spec = repl.tool.spec["function"]
    assert spec["name"] == "python" and spec["parameters"]["required"] == ["code"]
    assert await repl.tool(code="import math\nr = 2") == "(no output)"
    assert await repl.tool(code="print('area'); math.pi * r ** 2") == "area\n12.566370614359172"
    error = await repl.tool(code="undefined_name")
    assert "NameError: name 'undefined_name' is not defined" in error
    stuck = await repl.tool(code="while True: pass")
    assert "[execution timed out after" in stuck
    assert "NameError" in await repl.tool(code="r")  # the timeout restarted the interpreter
    await repl.close()
    assert sandbox._sessions == set()


async def test_bad_calls_and_long_output(sandbox):
    repl = PythonREPL(sandbox, max_output_chars=200)
    with pytest.raises(ToolError, match="empty"):
        await repl.tool(code="   ")
    long = await repl.tool(code="print('a' * 150 + 'b' * 150)")
    assert len(long) < 300 and "characters cut" in long and long.startswith("a") and long.endswith("b")
    await repl.close()
