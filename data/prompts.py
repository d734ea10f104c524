"""Prompt files: what ``prove-decode``, ``prove-bench`` and distillation read, and the resume rule of output files.

Input: JSONL whose lines carry a ``prompt`` (raw text, fed as given) or ``messages`` (chat turns, rendered
with the model's chat template) field and optionally an ``id``, an ``answer`` and a ``category``, or a plain-text file with
one raw-text prompt per non-empty line. ``chat=True`` wraps raw text as one user turn (the same rule as
``Decoder.generate``). An output JSONL file that already holds records is resumed (:func:`finished_ids`):
finished ids are skipped and a half-written last line (a killed run) is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PromptRecord:
    id: int | str
    prompt: str | list[dict[str, str]]
    """Raw text, or chat messages ({"role", "content"})."""
    answer: str | None = None
    """The JSONL row's ``answer`` field, where the set carries one (the bench scores accuracy with it)."""
    line: int | None = field(default=None, compare=False)
    """The 1-based line of the prompt file it was read from (errors about the prompt name it); None: not from a file."""
    category: str | None = None
    """The JSONL row's ``category`` field, or the category a named suite gives it (``prove.data.suites``): the bench
    reports every number per category too."""


def read_prompts(path: str | Path) -> list[PromptRecord]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"prompts={path} is not a file: give a JSONL file (prompt / messages fields) or a text file"
        )
    lines = path.read_text().splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    is_jsonl = path.suffix in (".jsonl", ".json") or first.lstrip().startswith("{")
    records: list[PromptRecord] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not is_jsonl:
            records.append(PromptRecord(len(records), line, line=lineno))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{lineno} is not valid JSON ({e.msg}); one JSON object per line"
            ) from None
        if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
            raise ValueError(
                f"{path}:{lineno} needs exactly one of the fields 'prompt' (text) or 'messages' (chat)"
            )
        prompt: Any = row.get("prompt", row.get("messages"))
        if "messages" in row and not (
            isinstance(prompt, list)
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in prompt)
        ):
            raise ValueError(f"{path}:{lineno}: 'messages' must be a list of {{'role', 'content'}} objects")
        if "prompt" in row and not isinstance(prompt, str):
            raise ValueError(f"{path}:{lineno}: 'prompt' must be a string (use 'messages' for chat turns)")
        answer, category = row.get("answer"), row.get("category")
        records.append(
            PromptRecord(
                row.get("id", len(records)),
                prompt,
                None if answer is None else str(answer),
                line=lineno,
                category=None if category is None else str(category),
            )
        )
    ids = [r.id for r in records]
    if len(set(map(repr, ids))) != len(ids):
        raise ValueError(f"{path} repeats an id; ids must be unique (or leave them out to number the lines)")
    return records


def finished_ids(output: str | Path) -> set[str]:
    """Ids (as ``repr``) of the records already in ``output``; drops a half-written last line."""
    output = Path(output)
    if not output.is_file():
        return set()
    done: set[str] = set()
    good_bytes = 0
    with output.open("rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
                if not raw.endswith(b"\n"):
                    raise ValueError("unterminated line")
            except ValueError:
                break
            done.add(repr(rec["id"]))
            good_bytes += len(raw)
    if good_bytes != output.stat().st_size:
        with output.open("r+b") as f:
            f.truncate(good_bytes)
    return done


def render(record: PromptRecord, chat: bool = False) -> str | list[dict[str, str]]:
    """What the Decoder encodes: ``messages`` go through the chat template; raw text stays raw text, unless
    ``chat`` wraps it as one user turn."""
    if isinstance(record.prompt, str) and chat:
        return [{"role": "user", "content": record.prompt}]
    return record.prompt
