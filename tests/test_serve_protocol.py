"""The wire format's pure parts: actions and reset fields from frames, observation data, URLs."""

import json

import pytest

from forge_env.openenv import protocol as wire
from forge_env.openenv.client_env import result_text, websocket_url
from forge_env.tools import format_hermes_call


def test_actions_from_frames():
    raw = format_hermes_call("search", {"query": "x"})
    assert wire.parse_action({"content": raw}) == raw  # a raw reply: the env parses it like a string action
    assert wire.parse_action(raw) == raw
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    assert wire.parse_action({"content": "", "tool_calls": [call]}) == {"role": "assistant", "content": "",
                                                                         "tool_calls": [call]}
    mcp = wire.parse_action({"type": "call_tool", "tool_name": "read", "arguments": {"doc": 3}})
    assert mcp["tool_calls"][0]["function"] == {"name": "read", "arguments": json.dumps({"doc": 3})}
    # What is wrong inside a turn is left to the env (an error observation), not refused here.
    assert wire.parse_action({"role": "user", "content": "hi"}) == {"role": "user", "content": "hi"}
    assert wire.parse_action({"content": 3}) == {"role": "assistant", "content": 3}
    with pytest.raises(wire.ProtocolError) as error:
        wire.parse_action([1, 2])
    assert error.value.code == wire.VALIDATION_ERROR
    assert wire.action_to_wire({"role": "assistant", "content": "a", "name": "x"}) == {"role": "assistant",
                                                                                    "content": "a"}


def test_reset_fields():
    assert wire.parse_reset(None) == (None, None, None)
    assert wire.parse_reset({"seed": 3, "episode_id": "e", "other": 1}) == (3, None, "e")
    assert wire.parse_reset({"task": {"question": "q"}}) == (None, {"task": {"question": "q"}}, None)
    for bad in ({"seed": -1}, {"seed": "3"}, {"seed": True}, {"options": []}, {"episode_id": "x" * 300}, [1]):
        with pytest.raises(wire.ProtocolError):
            wire.parse_reset(bad)


def test_observation_data_and_urls():
    data = wire.reset_observation([{"role": "user", "content": "q"}], {"tools": [{"type": "function"}], "turn": 0})
    assert data == {"observation": {"messages": [{"role": "user", "content": "q"}], "terminated": False,
                                    "truncated": False, "info": {"turn": 0}, "tools": [{"type": "function"}]},
                    "reward": None, "done": False}
    assert wire.observation_data([], 1.0, False, True, {})["done"] is True
    assert websocket_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/ws"
    assert websocket_url("https://h/env") == "wss://h/env/ws"
    assert websocket_url("ws://h:1/ws") == "ws://h:1/ws"
    assert result_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "a\nb"
    assert result_text({"content": [], "data": {"x": 1}}) == '{"x": 1}'


def test_the_old_package_name_is_a_deprecated_alias():
    import importlib
    import sys

    import forge_env.openenv

    sys.modules.pop("forge_env.serve", None)
    with pytest.warns(DeprecationWarning, match="forge_env.openenv"):
        old = importlib.import_module("forge_env.serve")
    assert old.OpenEnvTextEnv is forge_env.openenv.OpenEnvTextEnv and old.OpenEnvError is forge_env.openenv.OpenEnvError
