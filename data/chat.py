"""Chat-template tokenization of one conversation for SFT / MARS training (DESIGN §2.1).

Per conversation: ``ids`` is the chat template of the whole conversation, ``P`` the length of the
template of all but the last message with the generation prompt, and ``labels = ids`` with
``labels[:P] = -100``: only the final assistant turn is trained.

The trained span is the final assistant content plus the end-of-turn EOS (``<|im_end|>`` in
ChatML). Whitespace a template writes *after* that EOS (ChatML's trailing ``\\n``) is dropped: a
decoder stops at EOS and never produces it, and MARS pads the example with EOS right after it.
"""

from __future__ import annotations

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


def check_messages(messages: Any) -> str | None:
    """The reason to skip this conversation, or None when it is trainable (before tokenizing)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or len(messages) == 0:
        return EMPTY_CONVERSATION
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            return MISSING_CONTENT
        if message.get("role") not in ROLES:
            return UNKNOWN_ROLE
    if messages[-1]["role"] != "assistant":
        return LAST_NOT_ASSISTANT
    if not messages[-1]["content"].strip():
        return EMPTY_RESPONSE
    return None


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
    reason = check_messages(messages)
    if reason is not None:
        return None, reason, False
    # Drop keys the dataset's schema filled with None (Arrow unifies every message's keys).
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    # Render to text, then encode without the tokenizer's own specials: the template already holds
    # any BOS it wants, and encoding through `tokenize=True` may add a second one.
    full_text = tokenizer.apply_chat_template(clean, tokenize=False)
    prompt_text = tokenizer.apply_chat_template(clean[:-1], tokenize=False, add_generation_prompt=True)
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
