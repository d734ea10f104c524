"""Prompt files in, JSONL records out: what ``prove-decode`` runs (DESIGN §3.1).

Input: JSONL whose lines carry a ``prompt`` (raw text, fed as given) or ``messages`` (chat turns, rendered
with the model's chat template) field and optionally an ``id``, or a plain-text file with one raw-text prompt
per non-empty line. ``chat=True`` wraps raw text as one user turn (the same rule as ``Decoder.generate``). Output: JSONL, one record per prompt
(``id``, ``prompt``, ``completion``, ``token_ids`` = new tokens only, ``stats``, ``method``), written and
flushed as each finishes. An output file that already holds records is resumed: finished ids are skipped
and a half-written last line (a killed run) is dropped, so nothing finished is lost or repeated.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.config import DecodeConfig
    from prove.decode.decoder import Decoder


@dataclass(frozen=True)
class PromptRecord:
    id: int | str
    prompt: str | list[dict[str, str]]
    """Raw text, or chat messages ({"role", "content"})."""
    answer: str | None = None
    """The JSONL row's ``answer`` field, where the set carries one (the bench scores accuracy with it)."""


def read_prompts(path: str | Path) -> list[PromptRecord]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts={path} is not a file: give a JSONL file (prompt / messages fields) or a text file")
    lines = path.read_text().splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    is_jsonl = path.suffix in (".jsonl", ".json") or first.lstrip().startswith("{")
    records: list[PromptRecord] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not is_jsonl:
            records.append(PromptRecord(len(records), line))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno} is not valid JSON ({e.msg}); one JSON object per line") from None
        if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
            raise ValueError(f"{path}:{lineno} needs exactly one of the fields 'prompt' (text) or 'messages' (chat)")
        prompt: Any = row.get("prompt", row.get("messages"))
        if "messages" in row and not (
            isinstance(prompt, list) and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in prompt)
        ):
            raise ValueError(f"{path}:{lineno}: 'messages' must be a list of {{'role', 'content'}} objects")
        if "prompt" in row and not isinstance(prompt, str):
            raise ValueError(f"{path}:{lineno}: 'prompt' must be a string (use 'messages' for chat turns)")
        answer = row.get("answer")
        records.append(PromptRecord(row.get("id", len(records)), prompt, None if answer is None else str(answer)))
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


def decode_prompts(
    decoder: Decoder,
    records: list[PromptRecord],
    output: str | Path,
    *,
    max_new_tokens: int,
    stop: list[str] | None = None,
    chat: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Decode ``records`` not yet in ``output``, appending one flushed JSONL record per prompt.

    Each prompt is seeded with ``seed`` + its position in the file, so a resumed run samples as an
    uninterrupted one would.
    """
    from tqdm import tqdm

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(output)
    todo = [(i, r) for i, r in enumerate(records) if repr(r.id) not in done]
    for _, rec in todo:  # a prompt too long for the models fails here, before anything is decoded
        try:
            decoder.check_length(len(decoder.encode(render(rec, chat))), max_new_tokens)
        except ValueError as e:
            raise ValueError(f"prompt {rec.id!r}: {e}") from None
    bar = tqdm(total=len(records), initial=len(records) - len(todo), file=sys.stderr, disable=not progress, unit="prompt")
    with output.open("a") as f:
        for i, rec in todo:
            result = decoder.generate(render(rec, chat), max_new_tokens=max_new_tokens, stop=stop, seed=seed + i)
            row: dict[str, Any] = {
                "id": rec.id,
                "prompt": rec.prompt,
                "completion": result.text,
                "token_ids": result.token_ids,
                "method": decoder.method.name,
                "stats": result.stats.to_dict(),
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            bar.set_postfix(tok_per_cycle=f"{result.stats.tokens_per_cycle:.2f}")
            bar.update()
    bar.close()
    return output


def run(cfg: DecodeConfig) -> Path:
    """The ``prove-decode`` run: load the models, decode the prompt file, write the output file."""
    from prove.decode.decoder import Decoder
    from prove.decode.methods import resolve_params

    resolve_params(cfg.method, cfg.proposer, **vars(cfg.params()))  # every parameter checked before any file or model
    records = read_prompts(cfg.prompts)
    decoder = Decoder(
        cfg.model,
        method=cfg.method,
        proposer=cfg.proposer,
        verifier=cfg.verifier,
        draft=cfg.draft,
        device=cfg.device,
        dtype=cfg.dtype,
        trace=cfg.trace,
        **vars(cfg.params()),
    )
    return decode_prompts(
        decoder, records, cfg.output, max_new_tokens=cfg.max_new_tokens, stop=list(cfg.stop), chat=cfg.chat, seed=cfg.seed
    )
