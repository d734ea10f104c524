"""tokenize_conversation (docs/design.md §2.1): ids = whole template, labels mask exactly the prompt."""

from __future__ import annotations

import copy

import pytest
from prove.data.chat import (
    EMPTY_CONVERSATION,
    EMPTY_RESPONSE,
    IGNORE_INDEX,
    LAST_NOT_ASSISTANT,
    MISSING_CONTENT,
    PROMPT_TOO_LONG,
    TEMPLATE_MISMATCH,
    UNKNOWN_ROLE,
    SkipReport,
    ensure_chat_template,
    tokenize_conversation,
)

CHAT = [
    {"role": "user", "content": "Ana has 3 apples and gets 4 more. How many apples does Ana have?"},
    {"role": "assistant", "content": "Ana starts with 3, so 3 + 4 = 7. The answer is 7."},
]
MULTI = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "Ben has 2 pens and gets 5 more. How many pens does Ben have?"},
    {"role": "assistant", "content": "Ben starts with 2, so 2 + 5 = 7. The answer is 7."},
    {"role": "user", "content": "And with 1 more?"},
    {"role": "assistant", "content": "7 + 1 = 8. The answer is 8."},
]


def _prompt_len(tok, messages):
    text = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("messages", [CHAT, MULTI], ids=["single-turn", "system+multi-turn"])
def test_labels_mask_exactly_the_prompt(tokenizer, messages):
    out = tokenize_conversation(tokenizer, messages, max_len=512)
    ids, labels = out["input_ids"], out["labels"]
    P = _prompt_len(tokenizer, messages)
    assert len(ids) == len(labels)
    assert labels[:P] == [IGNORE_INDEX] * P
    assert labels[P:] == ids[P:]
    # The trained span is the final assistant turn plus EOS, nothing else (earlier turns are masked).
    assert tokenizer.decode(ids[P:]) == messages[-1]["content"] + "<|im_end|>"
    assert ids[-1] == tokenizer.eos_token_id
    # ids is the whole template, minus ChatML's newline after the last <|im_end|>.
    whole = tokenizer.apply_chat_template(messages)["input_ids"]
    assert whole == ids + tokenizer("\n", add_special_tokens=False)["input_ids"]


def test_extra_none_keys_are_ignored(tokenizer):
    """Arrow gives every message every key another message had; None-valued ones must not matter."""
    messy = [dict(m, tool_calls=None, name=None) for m in CHAT]
    assert tokenize_conversation(tokenizer, messy, 512) == tokenize_conversation(tokenizer, CHAT, 512)


def test_right_truncation(tokenizer):
    full = tokenize_conversation(tokenizer, CHAT, 512)
    P = _prompt_len(tokenizer, CHAT)
    report = SkipReport()
    out = tokenize_conversation(tokenizer, CHAT, P + 3, report=report)
    assert out["input_ids"] == full["input_ids"][: P + 3]
    assert out["labels"] == full["labels"][: P + 3]
    assert sum(label != IGNORE_INDEX for label in out["labels"]) == 3
    assert (report.kept, report.truncated, report.num_skipped) == (1, 1, 0)


def test_prompt_as_long_as_max_len_is_dropped(tokenizer):
    P = _prompt_len(tokenizer, CHAT)
    report = SkipReport()
    assert tokenize_conversation(tokenizer, CHAT, P, report=report) is None
    assert report.skipped == {PROMPT_TOO_LONG: 1}
    kept = tokenize_conversation(tokenizer, CHAT, P + 1, report=report)
    assert sum(label != IGNORE_INDEX for label in kept["labels"]) == 1


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([], EMPTY_CONVERSATION),
        (None, EMPTY_CONVERSATION),
        ([CHAT[0], {"role": "assistant", "content": None}], MISSING_CONTENT),
        ([CHAT[0], {"role": "assistant"}], MISSING_CONTENT),
        ([CHAT[0], {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}], MISSING_CONTENT),
        ([{"role": "narrator", "content": "Once."}, CHAT[1]], UNKNOWN_ROLE),
        ([{"content": "no role"}, CHAT[1]], UNKNOWN_ROLE),
        ([CHAT[0]], LAST_NOT_ASSISTANT),
        ([CHAT[0], {"role": "assistant", "content": "  \n"}], EMPTY_RESPONSE),
    ],
)
def test_bad_rows_are_skipped_and_counted(tokenizer, messages, reason):
    report = SkipReport()
    assert tokenize_conversation(tokenizer, messages, 512, report=report) is None
    assert report.skipped == {reason: 1} and report.kept == 0 and report.total == 1


def test_tool_turns_are_valid(tokenizer):
    messages = [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "add(2, 3)"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The answer is 5."},
    ]
    out = tokenize_conversation(tokenizer, messages, 512)
    P = _prompt_len(tokenizer, messages)
    assert tokenizer.decode(out["input_ids"][P:]) == "The answer is 5.<|im_end|>"


def test_template_whose_prompt_is_not_a_prefix_is_skipped(tokenizer):
    tok = copy.deepcopy(tokenizer)
    # A generation prompt that opens a think block the stored conversation does not have.
    tok.chat_template = tok.chat_template.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"
    )
    report = SkipReport()
    assert tokenize_conversation(tok, CHAT, 512, report=report) is None
    assert report.skipped == {TEMPLATE_MISMATCH: 1}


def test_no_chat_template_names_the_fix(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="data.chat_template=chatml"):
        tokenize_conversation(tok, CHAT, 512)
    ensure_chat_template(tok, "chatml")
    assert tokenize_conversation(tok, CHAT, 512) == tokenize_conversation(tokenizer, CHAT, 512)


def test_skip_report_line():
    report = SkipReport()
    for reason in (None, None, MISSING_CONTENT, UNKNOWN_ROLE, MISSING_CONTENT):
        report.add(reason)
    report.add(None, truncated=True)
    assert (report.total, report.kept, report.truncated, report.num_skipped) == (6, 3, 1, 3)
    assert str(report) == (
        "kept 3/6 conversations (1 right-truncated); skipped 3: missing_content 2, unknown_role 1"
    )
