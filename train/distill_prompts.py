"""Stage distill's prompts (:mod:`prove.train.distill`, step 1): which prompts a generated set answers — the first
``distill.num_prompts`` of ``distill.prompts`` or of the data's conversations (after the ``distill.prompt_seed``
shuffle), none that an earlier set of ``distill.exclude_from`` read (their ``generation.json``'s ``prompt_ids``),
each as its plain chat turns."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prove.data.chat import to_template_messages
from prove.data.prompts import read_prompts, render
from prove.train.rows import load_rows

if TYPE_CHECKING:
    from prove.train.config import TrainConfig

log = logging.getLogger(__name__)

GENERATION_JSON = "generation.json"
"""The generated set's record of its proposer, settings and prompt ids, in ``distill.generated_dir``."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    index: int
    """Position in the prompt set (the order of the assembled dataset)."""
    id: str
    messages: list[dict[str, str]]
    """The prompt turns ({role, content})."""


def prompt_set(cfg: TrainConfig) -> tuple[list[Prompt], str]:
    """The prompts to answer and a description of their source (recorded in generation.json): the first
    ``num_prompts`` (after the ``prompt_seed`` shuffle) whose ids no set of ``distill.exclude_from`` read; fewer
    than ``num_prompts + reserve_prompts`` such prompts is a ValueError."""
    d = cfg.distill
    excluded = excluded_ids(d.exclude_from)
    prompts: list[Prompt] = []
    if d.prompts is not None:
        records = [rec for rec in read_prompts(d.prompts) if str(rec.id) not in excluded]
        _check_enough(len(records), d.num_prompts, d.reserve_prompts, d.prompts, excluded)
        for rec in records:
            turns = render(rec, chat=True)
            assert isinstance(turns, list)
            prompts.append(Prompt(len(prompts), str(rec.id), _clean(turns)))
            if d.num_prompts is not None and len(prompts) >= d.num_prompts:
                break
        source = str(d.prompts)
    else:
        rows = load_rows(cfg)
        if d.prompt_seed is not None:  # a sample of the whole mixture (Dolci's rows are grouped by source)
            rows = rows.shuffle(seed=d.prompt_seed)
        if excluded:
            if "id" not in rows.column_names:
                raise ValueError(
                    f"distill.exclude_from needs rows with an `id` column ({cfg.data.path} has none): drop "
                    "distill.exclude_from, or give the rows ids"
                )
            keep = [i for i, x in enumerate(rows["id"]) if str(x) not in excluded]
            rows = rows.select(keep)
        _check_enough(len(rows), d.num_prompts, d.reserve_prompts, cfg.data.path, excluded)
        if d.num_prompts is not None:
            rows = rows.select(range(min(d.num_prompts, len(rows))))
        with_tools = 0
        for i, row in enumerate(rows):
            conversation, _ = to_template_messages(row["messages"])
            if conversation is None:
                continue
            turns = conversation.messages
            if turns and turns[-1]["role"] == "assistant":
                turns = turns[:-1]
            if conversation.tools or any(m.get("tool_calls") or m["role"] == "tool" for m in turns):
                with_tools += 1  # the decoder encodes plain chat prompts (no tools=)
                continue
            turns = _clean(turns)
            if not turns:
                continue
            prompts.append(Prompt(len(prompts), str(row.get("id", i)), turns))
        if with_tools:
            log.warning(
                "distill: skipped %d prompts with tool schemas or tool turns (generation takes plain chat)",
                with_tools,
            )
        source = (
            f"data:{cfg.data.path}" + (f"[{cfg.data.name}]" if cfg.data.name else "") + f":{cfg.data.split}"
        )
    if not prompts:
        raise ValueError(
            f"no prompts in {source}: set distill.prompts=<prompt file> or data.path=<conversations>"
        )
    return prompts, source


def excluded_ids(folders: Sequence[str]) -> set[str]:
    """The prompt ids the generated sets in ``folders`` read (their generation.json ``prompt_ids``)."""
    ids: set[str] = set()
    for folder in folders:
        path = Path(folder) / GENERATION_JSON
        if not path.is_file():
            raise ValueError(
                f"distill.exclude_from: {folder} holds no {GENERATION_JSON}: generate that set first (its "
                "round's stage=distill), or drop it from distill.exclude_from"
            )
        stored = json.loads(path.read_text())
        if "prompt_ids" not in stored:
            raise ValueError(
                f"distill.exclude_from: {path} records no prompt_ids (written before sets recorded them): "
                "regenerate that set, or drop it from distill.exclude_from"
            )
        ids.update(str(x) for x in stored["prompt_ids"])
    return ids


def _check_enough(available: int, wanted: int | None, reserve: int, source: Any, excluded: set[str]) -> None:
    need = (wanted or 0) + reserve
    if reserve and available < need:
        raise ValueError(
            f"{source}: {available} prompts unread by earlier sets ({len(excluded)} excluded), but this set "
            f"takes {wanted} and the later on-policy rounds {reserve}: lower rounds.count or "
            "rounds.num_prompts (or stages.proposer.distill.num_prompts), or generate more prompts"
        )
    if wanted is not None and excluded and available < wanted:
        raise ValueError(
            f"{source}: only {available} prompts are unread by the sets of distill.exclude_from, fewer than "
            f"distill.num_prompts={wanted}: lower it (rounds.num_prompts), or generate more prompts"
        )


def _clean(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {"role": str(m["role"]), "content": str(m["content"])}
        for m in messages
        if m.get("content") is not None
    ]
