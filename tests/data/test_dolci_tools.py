"""Dolci's schema ({id, messages: [{role, content, function_calls, functions}], source}) onto Qwen2.5's chat format:
``environment`` turns are tool responses, ``functions`` the ``tools=`` schemas, ``function_calls`` the assistant's
``tool_calls``; the rendered text of each kind, and every row that cannot be used counted by reason."""

from __future__ import annotations

import copy
import json

import pytest
from prove.data.chat import (
    BAD_FUNCTION_CALLS,
    BAD_FUNCTIONS,
    EMPTY_RESPONSE,
    IGNORE_INDEX,
    LAST_NOT_ASSISTANT,
    MISPLACED_FUNCTION_CALLS,
    MISSING_CONTENT,
    TEMPLATE_DROPS_TOOLS,
    UNKNOWN_ROLE,
    SkipReport,
    parse_function_calls,
    render,
    to_template_messages,
    tokenize_conversation,
)


def M(role, content, function_calls=None, functions=None):  # noqa: N802 - a Dolci message, as the dataset spells it
    return {"role": role, "content": content, "function_calls": function_calls, "functions": functions}


WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}
TOOL_JSON = json.dumps({"type": "function", "function": WEATHER})
SYSTEM_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + TOOL_JSON
    + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'

# (Dolci messages, what Qwen2.5's chat format renders for them)
KINDS = {
    "plain chat": (
        [M("user", "Hi!"), M("assistant", "Hello!")],
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n",
    ),
    "system prompt": (
        [M("system", "Be brief."), M("user", "Hi!"), M("assistant", "Hello!")],
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    ),
    "tool call + environment response": (
        [
            M("system", "You report weather.", functions=json.dumps([WEATHER])),
            M("user", "Oslo?"),
            M("assistant", "", function_calls='[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
            M("environment", '{"temp": -3}'),
            M("assistant", "It is -3 °C in Oslo."),
        ],
        "<|im_start|>system\nYou report weather.\n\n" + SYSTEM_TOOLS + "<|im_start|>user\nOslo?<|im_end|>\n"
        "<|im_start|>assistant\n" + CALL + "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": -3}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\nIt is -3 °C in Oslo.<|im_end|>\n",
    ),
    "final turn with text + call": (
        [
            M("user", "Oslo?", functions=json.dumps(WEATHER)),
            M("assistant", "Let me check.", function_calls='get_weather(city="Oslo")'),
        ],
        "<|im_start|>system\nYou are a helpful assistant.\n\n"
        + SYSTEM_TOOLS
        + "<|im_start|>user\nOslo?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n" + CALL + "<|im_end|>\n",
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_rendered_text_of_each_kind(tokenizer, kind):
    messages, want = KINDS[kind]
    conversation, reason = to_template_messages(messages)
    assert reason is None
    assert render(tokenizer, conversation) == want
    # what is trained: the final assistant turn, tool calls included, up to its <|im_end|>
    out = tokenize_conversation(tokenizer, messages, 1024)
    trained = [t for t, label in zip(out["input_ids"], out["labels"], strict=True) if label != IGNORE_INDEX]
    final = want[want.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n") :]
    assert tokenizer.decode(trained) == final.removesuffix("\n")


def test_the_call_of_a_text_and_call_turn_is_trained(tokenizer):
    """The defect: the old code trained "Let me check." with the call deleted."""
    out = tokenize_conversation(tokenizer, KINDS["final turn with text + call"][0], 1024)
    trained = tokenizer.decode(
        [t for t, label in zip(out["input_ids"], out["labels"], strict=True) if label != -100]
    )
    assert trained == "Let me check.\n" + CALL + "<|im_end|>"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ('{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),
        ('[{"name": "f", "arguments": "{\\"a\\": 1}"}, {"name": "g"}]', [("f", {"a": 1}), ("g", {})]),
        ({"function": {"name": "f", "arguments": {"a": [1, 2]}}}, [("f", {"a": [1, 2]})]),
        ("<function_calls>f(a=1)</function_calls>", [("f", {"a": 1})]),
        ('f(a="x y", b=[1, 2], c=None, d=True)', [("f", {"a": "x y", "b": [1, 2], "c": None, "d": True})]),
        ('f(a=1)\ng(b={"k": -2.5})', [("f", {"a": 1}), ("g", {"b": {"k": -2.5}})]),
        ("[f(a=1), math.sqrt(x=4)]", [("f", {"a": 1}), ("math.sqrt", {"x": 4})]),
        (
            'get_weather("Oslo", unit="c")',
            [("get_weather", {"city": "Oslo", "unit": "c"})],
        ),  # named by the schema
    ],
)
def test_function_calls_json_and_python(value, want):
    calls = parse_function_calls(value, [{"type": "function", "function": WEATHER}])
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == want
    assert all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize(
    "value",
    [
        "f(a=b)",
        "f(**kw)",
        "g(1)",
        "f(a=1",
        "x = f(a=1)",
        "f(a=1) + 1",
        '{"arguments": {}}',
        "[]",
        '{"name": "f", "arguments": "{bad"}',
        "get_weather('Oslo', city='Rome')",
    ],
)
def test_unparsable_function_calls(value):
    conversation, reason = to_template_messages(
        [M("user", "q", functions=json.dumps([WEATHER])), M("assistant", "", function_calls=value)]
    )
    assert conversation is None and reason == BAD_FUNCTION_CALLS


def test_other_unusable_tool_rows():
    assert to_template_messages(
        [M("system", "s", functions="not json"), M("user", "q"), M("assistant", "a")]
    )[1] == (BAD_FUNCTIONS)
    assert to_template_messages(
        [M("user", "q", functions='[{"description": "no name"}]'), M("assistant", "a")]
    )[1] == (BAD_FUNCTIONS)
    assert to_template_messages([M("user", "q", function_calls="f(a=1)"), M("assistant", "a")])[1] == (
        MISPLACED_FUNCTION_CALLS
    )


def test_a_template_without_tool_support_is_counted_not_trained(tokenizer):
    """Qwen2.5-style templates render tools; one that ignores them would train the call away: skipped, counted."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    report = SkipReport()
    for kind in KINDS:
        tokenize_conversation(tok, KINDS[kind][0], 1024, report=report)
    assert report.kept == 2 and report.skipped == {TEMPLATE_DROPS_TOOLS: 2}


def test_shipped_sample_counts_every_unusable_row_by_reason(sample_path, tokenizer):
    from prove.data.build import build_tokenized_dataset
    from prove.data.conversations import load_chat_dataset

    ds = load_chat_dataset(str(sample_path))
    assert {"id", "messages", "source"} == set(ds.column_names)
    assert all(
        set(m) == {"role", "content", "function_calls", "functions"} for row in ds for m in row["messages"]
    )
    roles = {m["role"] for row in ds for m in row["messages"]}
    assert "environment" in roles and "tool" not in roles
    tool_rows = [row for row in ds if any(m["function_calls"] or m["functions"] for m in row["messages"])]
    assert len(tool_rows) >= 5
    _, report = build_tokenized_dataset(ds, tokenizer, 4096)
    assert report.total == len(ds) == 55
    assert dict(report.skipped) == {
        MISSING_CONTENT: 1,
        UNKNOWN_ROLE: 1,
        LAST_NOT_ASSISTANT: 1,
        EMPTY_RESPONSE: 1,
        BAD_FUNCTION_CALLS: 1,
        BAD_FUNCTIONS: 1,
    }
    assert "bad_function_calls 1" in str(report) and "bad_functions 1" in str(report)
    usable_tool_rows = [r for r in tool_rows if r["source"] == "tool-use"]
    for row in usable_tool_rows:  # every usable tool row renders its calls and the responses
        conversation, reason = to_template_messages(row["messages"])
        text = render(tokenizer, conversation)
        assert reason is None and "<tool_call>" in text and "<tools>" in text
        n_env = sum(m["role"] == "environment" for m in row["messages"])
        assert text.count("<tool_response>") == n_env
