"""Prompt rendering for ``prove_arith`` (loaded by lm-eval through ``!function utils.doc_to_text``).

A row is either chat (``messages``: the conversation, its last turn the reference assistant answer) or
raw (``prompt``: the text the model continues). Chat rows give the last user turn, so lm-eval's
``--apply_chat_template`` renders exactly the prompt the tiny recipe trained on.
"""

from __future__ import annotations

from typing import Any


def doc_to_text(doc: dict[str, Any]) -> str:
    if doc.get("prompt"):
        return str(doc["prompt"])
    messages = doc.get("messages") or []
    users = [m["content"] for m in messages if m.get("role") == "user"]
    if not users:
        raise ValueError(
            f"prove_arith rows need a `prompt` or a user turn in `messages`; got keys {sorted(doc)}"
        )
    return str(users[-1])


def doc_to_target(doc: dict[str, Any]) -> str:
    return str(doc["answer"]).strip()
