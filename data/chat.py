"""Chat-template tokenization of one conversation for SFT / MARS training (docs/design.md §2.1).

Dolci rows are first mapped onto what a Hugging Face chat template renders (:func:`to_template_messages`):
Dolci writes a tool's output as an ``environment`` turn, the tool schemas as a ``functions`` string on a
(system or user) message and the calls as a ``function_calls`` string on the assistant message (JSON, or
Python-call syntax such as ``get_weather(city="Paris")``). Qwen2.5's template instead takes the schemas as
``tools=`` and the calls as the assistant message's ``tool_calls`` (``[{type, function: {name, arguments}}]``
with ``arguments`` a dict), and renders a ``tool`` turn as the tool response. A row whose schemas or calls
cannot be parsed, or whose tools the tokenizer's template would silently drop, is skipped and counted by
reason — never trained with the call deleted.

Per conversation: ``ids`` is the chat template of the whole conversation, ``P`` the length of the
template of all but the last message with the generation prompt, and ``labels = ids`` with
``labels[:P] = -100``: only the final assistant turn is trained.

The trained span is the final assistant content plus the end-of-turn EOS (``<|im_end|>`` in
ChatML). Whitespace a template writes *after* that EOS (ChatML's trailing ``\\n``) is dropped: a
decoder stops at EOS and never produces it, and MARS pads the example with EOS right after it.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

IGNORE_INDEX = -100
ROLES = frozenset({"system", "user", "assistant", "tool"})

# Skip reasons, as counted in SkipReport.
EMPTY_CONVERSATION = "empty_conversation"
MISSING_CONTENT = "missing_content"
UNKNOWN_ROLE = "unknown_role"
LAST_NOT_ASSISTANT = "last_not_assistant"
EMPTY_RESPONSE = "empty_response"
PROMPT_TOO_LONG = "prompt_too_long"
TEMPLATE_MISMATCH = "template_mismatch"
BAD_FUNCTIONS = "bad_functions"  # a `functions` tool schema that is not a JSON list/object of named functions
BAD_FUNCTION_CALLS = "bad_function_calls"  # `function_calls` neither JSON calls nor literal Python calls
MISPLACED_FUNCTION_CALLS = "function_calls_not_assistant"  # calls on a user/system/tool turn
TEMPLATE_DROPS_TOOLS = (
    "template_drops_tools"  # the chat template renders the same text without the tools/calls
)

# Dolci's role names that Hugging Face chat templates spell differently.
ROLE_ALIASES = {"environment": "tool"}
# Keys of a Dolci message that are translated (not passed to the template as they are).
_DOLCI_TOOL_KEYS = ("functions", "function_calls")


@dataclass
class SkipReport:
    """What tokenization kept, truncated and skipped (by reason); ``str()`` gives one line to log."""

    total: int = 0
    kept: int = 0
    truncated: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str | None, *, truncated: bool = False) -> None:
        """Count one row: kept when ``reason`` is None, else skipped for ``reason``."""
        self.total += 1
        if reason is None:
            self.kept += 1
            self.truncated += int(truncated)
        else:
            self.skipped[reason] += 1

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def __str__(self) -> str:
        line = f"kept {self.kept}/{self.total} conversations ({self.truncated} right-truncated)"
        if self.skipped:
            reasons = ", ".join(f"{reason} {n}" for reason, n in self.skipped.most_common())
            line += f"; skipped {self.num_skipped}: {reasons}"
        return line


def ensure_chat_template(tokenizer: Any, chat_template: str | None = None) -> Any:
    """Give ``tokenizer`` a chat template, or check it has one; returns the tokenizer.

    ``chat_template`` is ``None`` (keep the tokenizer's own), ``"chatml"`` (the ChatML template of
    :mod:`prove.data.tokenizer`), or a Jinja template string.
    """
    if chat_template == "chatml":
        from prove.data.tokenizer import CHATML_TEMPLATE

        tokenizer.chat_template = CHATML_TEMPLATE
    elif chat_template is not None:
        tokenizer.chat_template = chat_template
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'this model'!r} has no chat template: "
            "pick an instruct model, set tokenizer.chat_template, or pass data.chat_template=chatml"
        )
    return tokenizer


@dataclass(frozen=True)
class TemplateConversation:
    """A conversation as a chat template takes it: ``apply_chat_template(messages, tools=tools)``."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    """The tool schemas (``{"type": "function", "function": {name, description, parameters}}``), if any."""

    @property
    def has_tool_calls(self) -> bool:
        return any(m.get("tool_calls") for m in self.messages)


class _Unusable(ValueError):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def to_template_messages(messages: Any) -> tuple[TemplateConversation | None, str | None]:
    """Map Dolci's message schema onto a chat template's: ``(conversation, None)`` or ``(None, skip reason)``.

    Per message: keys the dataset filled with None are dropped (Arrow gives every message every key);
    ``environment`` → ``tool``; ``functions`` (a JSON string or list of schemas, on any turn) joins the
    conversation's ``tools`` (first schema of a name wins); ``function_calls`` (assistant turns only) becomes
    ``tool_calls`` — :func:`parse_function_calls` reads JSON and Python-call strings; an assistant turn
    that only calls gets ``content=""``. Rows that already use ``tools``/``tool_calls`` pass unchanged.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or len(messages) == 0:
        return None, EMPTY_CONVERSATION
    out: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    pending_calls: list[tuple[int, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None, MISSING_CONTENT
        m = {k: v for k, v in message.items() if v is not None and k not in _DOLCI_TOOL_KEYS}
        if isinstance(m.get("role"), str):
            m["role"] = ROLE_ALIASES.get(m["role"], m["role"])
        try:
            for tool in parse_functions(message.get("functions")):
                tools.setdefault(tool["function"]["name"], tool)
        except _Unusable as err:
            return None, err.reason
        calls = message.get("function_calls")
        if calls is not None and not (isinstance(calls, str) and not calls.strip()):
            if m.get("role") != "assistant":
                return None, MISPLACED_FUNCTION_CALLS
            pending_calls.append((len(out), calls))
        out.append(m)
    schema = list(tools.values())
    for i, calls in pending_calls:  # after every schema is known: positional Python arguments need them
        try:
            parsed = parse_function_calls(calls, schema)
        except _Unusable as err:
            return None, err.reason
        out[i]["tool_calls"] = list(out[i].get("tool_calls", [])) + parsed
        if out[i].get("content") is None:
            out[i]["content"] = ""
    return TemplateConversation(out, schema or None), None


def parse_functions(value: Any) -> list[dict[str, Any]]:
    """Dolci's ``functions`` (JSON text, a list, or one schema) as ``[{"type": "function", "function": {...}}]``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _Unusable(BAD_FUNCTIONS) from None
    items = value if isinstance(value, list) else [value]
    tools = []
    for item in items:
        if not isinstance(item, Mapping):
            raise _Unusable(BAD_FUNCTIONS)
        inner = item.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else item
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _Unusable(BAD_FUNCTIONS)
        tools.append({"type": "function", "function": dict(fn)})
    return tools


def parse_function_calls(value: Any, tools: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Dolci's ``function_calls`` as ``tool_calls``: ``[{"type": "function", "function": {name, arguments}}]``.

    Accepts a list/dict, or a string holding either JSON (``{"name": ..., "arguments": {...}}`` or a list of
    them; ``arguments`` may itself be a JSON string) or Python calls, one per line or in a list
    (``search(query="x", limit=3)``, ``[f(a=1), g(b=2)]``); arguments must be literals, and positional ones are
    named from the tool's schema (``tools``). Anything else raises (skip reason ``bad_function_calls``).
    """
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("<function_calls>") and text.endswith("</function_calls>"):
            text = text[len("<function_calls>") : -len("</function_calls>")].strip()
        try:
            value = json.loads(text)
        except ValueError:
            return _python_calls(text, tools)
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _Unusable(BAD_FUNCTION_CALLS)
    return [_json_call(item) for item in items]


def _json_call(item: Any) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise _Unusable(BAD_FUNCTION_CALLS)
    inner = item.get("function")
    fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else item
    name = fn.get("name")
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise _Unusable(BAD_FUNCTION_CALLS) from None
    if not isinstance(name, str) or not name or not isinstance(args, Mapping):
        raise _Unusable(BAD_FUNCTION_CALLS)
    return {"type": "function", "function": {"name": name, "arguments": dict(args)}}


def _python_calls(text: str, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    try:
        tree = ast.parse(text, mode="exec")
    except (SyntaxError, ValueError):
        raise _Unusable(BAD_FUNCTION_CALLS) from None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise _Unusable(BAD_FUNCTION_CALLS)
        nodes.extend(stmt.value.elts if isinstance(stmt.value, ast.List | ast.Tuple) else [stmt.value])
    if not nodes:
        raise _Unusable(BAD_FUNCTION_CALLS)
    params = {
        t["function"]["name"]: list((t["function"].get("parameters") or {}).get("properties") or {})
        for t in tools
    }
    return [_python_call(node, params) for node in nodes]


def _python_call(node: ast.expr, params: Mapping[str, list[str]]) -> dict[str, Any]:
    if not isinstance(node, ast.Call):
        raise _Unusable(BAD_FUNCTION_CALLS)
    name = _dotted(node.func)
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        positional = [ast.literal_eval(a) for a in node.args]
    except ValueError:  # a variable or an expression, not a literal
        raise _Unusable(BAD_FUNCTION_CALLS) from None
    if any(kw.arg is None for kw in node.keywords):  # **kwargs
        raise _Unusable(BAD_FUNCTION_CALLS)
    if positional:
        names = params.get(name, [])
        if len(positional) > len(names) or any(n in args for n in names[: len(positional)]):
            raise _Unusable(BAD_FUNCTION_CALLS)  # no schema to name them by
        args = {**dict(zip(names, positional, strict=False)), **args}
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise _Unusable(BAD_FUNCTION_CALLS)


def check_messages(messages: Any) -> str | None:
    """The reason to skip this conversation, or None when it is trainable (before tokenizing).

    ``messages`` in the template's schema (:func:`to_template_messages`): every turn has a string content
    (``""`` for an assistant turn that only calls tools) and a known role.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or len(messages) == 0:
        return EMPTY_CONVERSATION
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            return MISSING_CONTENT
        if message.get("role") not in ROLES:
            return UNKNOWN_ROLE
    if messages[-1]["role"] != "assistant":
        return LAST_NOT_ASSISTANT
    if not messages[-1]["content"].strip() and not messages[-1].get("tool_calls"):
        return EMPTY_RESPONSE
    return None


def render(tokenizer: Any, conversation: TemplateConversation, *, add_generation_prompt: bool = False) -> str:
    """The chat template's text of ``conversation`` (its tools passed as ``tools=``)."""
    return tokenizer.apply_chat_template(
        conversation.messages,
        tools=conversation.tools,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def drops_tools(tokenizer: Any, conversation: TemplateConversation, full: str | None = None) -> bool:
    """Whether the tokenizer's template ignores this conversation's tool schemas or tool calls (renders the
    same text without them), as a template without tool support does. ``full``: the conversation's render,
    when the caller has it already."""
    full = render(tokenizer, conversation) if full is None else full
    if conversation.tools and full == render(tokenizer, TemplateConversation(conversation.messages)):
        return True
    if conversation.has_tool_calls:
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in conversation.messages]
        if full == render(tokenizer, TemplateConversation(plain, conversation.tools)):
            return True
    return False


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    max_len: int,
    *,
    report: SkipReport | None = None,
) -> dict[str, list[int]] | None:
    """Token ids and labels of one conversation, or None when it is skipped.

    Returns ``{"input_ids": ids, "labels": labels}`` (equal lengths, at most ``max_len``) with the
    prompt masked to -100. Skipped (None): malformed rows (see :func:`check_messages`), a prompt of
    ``max_len`` tokens or more, or a template whose prompt render is not a token prefix of the full
    render. Longer conversations are right-truncated. ``report``, when given, counts the outcome.
    """
    encoded, reason, truncated = encode_conversation(tokenizer, messages, max_len)
    if report is not None:
        report.add(reason, truncated=truncated)
    return encoded


def encode_conversation(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], max_len: int
) -> tuple[dict[str, list[int]] | None, str | None, bool]:
    """``(encoded or None, skip reason or None, truncated)`` — :func:`tokenize_conversation`'s core."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1 (got {max_len}): set data.max_len")
    ensure_chat_template(tokenizer)
    conversation, reason = to_template_messages(messages)
    if conversation is not None:
        reason = check_messages(conversation.messages)
    if reason is not None:
        return None, reason, False
    assert conversation is not None
    # Render to text, then encode without the tokenizer's own specials: the template already holds
    # any BOS it wants, and encoding through `tokenize=True` may add a second one.
    full_text = render(tokenizer, conversation)
    if (conversation.tools or conversation.has_tool_calls) and drops_tools(
        tokenizer, conversation, full_text
    ):
        return None, TEMPLATE_DROPS_TOOLS, False
    prompt = TemplateConversation(conversation.messages[:-1], conversation.tools)
    prompt_text = render(tokenizer, prompt, add_generation_prompt=True)
    ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    P = len(prompt_ids)
    if ids[:P] != prompt_ids or len(ids) <= P:
        return None, TEMPLATE_MISMATCH, False
    if P >= max_len:
        return None, PROMPT_TOO_LONG, False
    ids = _strip_after_eos(tokenizer, ids, P)
    truncated = len(ids) > max_len
    ids = ids[:max_len]
    labels = [IGNORE_INDEX] * P + ids[P:]
    return {"input_ids": ids, "labels": labels}, None, truncated


def _strip_after_eos(tokenizer: Any, ids: list[int], start: int) -> list[int]:
    """Cut what follows the response's last EOS when it is only whitespace (ChatML's ``\\n``)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        return ids
    for j in range(len(ids) - 1, start - 1, -1):
        if ids[j] == eos:
            if tokenizer.decode(ids[j + 1 :]).strip() == "":
                return ids[: j + 1]
            break
    return ids
