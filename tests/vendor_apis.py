"""The vendors' model APIs played on loopback (``tests/json_server.py``), answering as a model would to solve the
built-in task cli-write-note: the cloud APIs cannot be reached from here, and no key is needed, so everything
between the model's answer and the desktop (the SDK, osfleet's driver, the fleet) is the real thing. For the
examples' tests (tests/test_computer_use_examples.py on a stand-in desktop, ..._vm.py on a replica)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tests.json_server import Request

NOTE = "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"


def claude(request: Request) -> tuple[int, Any]:
    """Anthropic's Messages API as Claude would answer the cli-write-note task: look, click the terminal, type the
    command, press Enter, wait, zoom, and say it is done. The SDK's runner keeps a server-side thread: its first
    turn creates it (with the tools), each later one continues from the previous reply and sends only what is new."""
    body = request.body
    thread = body.get("thread") or {"type": "create"}
    if thread["type"] == "create":
        assert body["tools"] == [{"type": "computer_toolset_20260801"}], body.get("tools")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    else:
        turn = int(thread["previous_message_id"].removeprefix("msg_")) + 1
    sent = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert not any(b.get("is_error") for b in sent if b.get("type") == "tool_result"), sent
    plans = [
        [("screenshot", {})],
        [("left_click", {"coordinate": [200, 200]}), ("type", {"text": NOTE}), ("key", {"text": "Return"}),
         ("wait", {"duration": 2}), ("zoom", {"region": [0, 0, 640, 400]})],
    ]  # fmt: skip
    if turn < len(plans):
        content = [
            {"type": "tool_use", "id": f"toolu_{turn}_{i}", "name": name, "input": given, "toolset_name": "computer"}
            for i, (name, given) in enumerate(plans[turn])
        ]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": "The note is written."}], "end_turn"
    message = {"id": f"msg_{turn}", "type": "message", "role": "assistant", "model": body.get("model", "claude")}
    usage = {"input_tokens": 1, "output_tokens": 1}
    return 200, message | {"content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}


def gpt(request: Request) -> tuple[int, Any]:
    """OpenAI's Responses API as a GA computer-use model would answer: one computer_call, then a message."""
    items = request.body["input"] if isinstance(request.body["input"], list) else []
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "computer_call_output"]
    base = {"object": "response", "created_at": 0, "model": request.body["model"], "status": "completed"}
    base |= {
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
    }
    details = {"input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    base |= {"usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2, **details}}
    if not outputs:
        actions = [{"type": "click", "x": 200, "y": 200, "button": "left"}, {"type": "type", "text": NOTE},
                   {"type": "keypress", "keys": ["ENTER"]}, {"type": "wait"}]  # fmt: skip
        call = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
                "pending_safety_checks": [], "actions": actions}  # fmt: skip
        return 200, base | {"id": "resp_1", "output": [call]}
    assert outputs[-1]["output"]["image_url"].startswith("data:image/png;base64,")
    text = {"type": "output_text", "text": "The note is written.", "annotations": []}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]}
    return 200, base | {"id": "resp_2", "output": [message]}


def environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without any vendor's settings, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))} | extra


ENVIRONMENTS: dict[str, Callable[[str], dict[str, str]]] = {
    "anthropic_computer.py": lambda url: environment({"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "loopback"}),
    # openai-agents exports traces to OpenAI unless told not to: nothing leaves this machine
    "openai_computer.py": lambda url: environment(
        {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "loopback", "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    ),
}
"""Each example's environment with its vendor's API at ``url``."""
