"""The training rows of stages sft and mars: the conversations (the synthetic task generated first when configured
and missing), tokenized with the chat template by :mod:`prove.data`. Stage distill trains on its generated set
instead (:func:`prove.train.distill.training_rows`) but draws its prompts from :func:`load_rows`.

The tokenized set is built once and kept at ``<data.cache_dir>/<key>`` (``datasets.save_to_disk``). The key
(:func:`cache_key`) is what the rows depend on — the data source (path, and each local file's size and mtime),
split, row cap, ``max_len``, the tokenizer's vocabulary, merges and chat template — without the added
``<|mask|>`` token, which no conversation contains: stage mars reads the set stage sft built (``datasets``' own
cache keys on the whole tokenizer object, so adding the token made mars tokenize everything again). Each node's
first process (``LOCAL_RANK`` 0) builds it while the node's other processes wait on its marker file — outside
any collective, whose timeout (30 minutes) the ~2M rows of Dolci could outlast; on a file system the nodes
share, the first node to finish wins and the others' copies are dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prove.data.build import build_tokenized_dataset
from prove.data.conversations import load_chat_dataset
from prove.data.synthetic import main as write_synthetic
from prove.train.universal import wait_for

if TYPE_CHECKING:
    from prove.train.config import TrainConfig

log = logging.getLogger(__name__)


def load_rows(cfg: TrainConfig) -> Any:
    """The raw conversations (generating the synthetic tasks first when configured and missing)."""
    d = cfg.data
    if d.synthetic is not None and not Path(d.path).exists():
        out = Path(d.path).parent
        log.info("generating the arithmetic task into %s", out)
        write_synthetic(
            [
                "--out",
                str(out),
                "--n",
                str(d.synthetic.n),
                "--test-size",
                str(d.synthetic.test_size),
                "--seed",
                str(d.synthetic.seed),
                "--tasks",
                ",".join(d.synthetic.tasks),
                *(["--instruct"] if d.synthetic.instruct else []),
            ]
        )
        if not Path(d.path).exists():
            raise ValueError(
                f"data.path={d.path!r} is not where prove.data.synthetic writes: use <dir>/train.jsonl"
            )
    return load_chat_dataset(d.path, d.split, name=d.name, num_rows=d.num_rows)


CACHE_FORMAT = 1
"""Bumped when the tokenized rows change for the same inputs (a change to :mod:`prove.data.chat`'s encoding)."""
MARKER = "prove-tokenized.json"
"""Written into a cached set last: its presence means the set is whole."""


def tokenizer_fingerprint(tokenizer: Any, leave_out: str) -> str:
    """A hash of what tokenizes the rows — vocabulary, merges, normalisation, pre-tokenisation, post-processing,
    added tokens, chat template — with the added token ``leave_out`` (``<|mask|>``) left out. Only what encodes
    counts: a tokenizer saved and reloaded (stage sft's output, from which mars starts) hashes the same."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        full = json.loads(backend.to_str())
        model = full.get("model") or {}
        spec = {
            "model": {k: model.get(k) for k in ("type", "vocab", "merges", "byte_fallback", "unk_token")},
            **{k: full.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor")},
            "added": sorted(
                (t["content"], t["id"], bool(t.get("special"))) for t in full.get("added_tokens", [])
                if t.get("content") != leave_out
            ),
        }  # fmt: skip
    else:  # a slow tokenizer: its vocabulary
        spec = {"vocab": sorted((k, v) for k, v in tokenizer.get_vocab().items() if k != leave_out)}
    spec["chat_template"] = tokenizer.chat_template
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _source_files(path: str) -> list[list[Any]]:
    """``[relative path, size, mtime_ns]`` of a local data source's files (empty for a hub id)."""
    p = Path(path).expanduser()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else ([p] if p.is_file() else [])
    return [
        [str(f.relative_to(p) if p.is_dir() else f.name), f.stat().st_size, f.stat().st_mtime_ns]
        for f in files
    ]


def cache_key(cfg: TrainConfig, tokenizer: Any) -> str:
    """The tokenized set's key: what its rows depend on (module docstring), not the mask token."""
    d = cfg.data
    path = Path(d.path).expanduser()
    local = path.exists() or path.suffix != "" or d.synthetic is not None  # else a hub id
    parts = {
        "format": CACHE_FORMAT,
        "path": str(path.resolve()) if local else d.path,
        # a generated task is its settings (the same before and after it is written), other local data its files
        "files": _source_files(d.path) if d.synthetic is None else dataclasses.asdict(d.synthetic),
        "name": d.name,
        "split": d.split,
        "num_rows": d.num_rows,
        "max_len": d.max_len,
        "tokenizer": tokenizer_fingerprint(tokenizer, cfg.stage.mask_token),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def tokenized_dataset(cfg: TrainConfig, tokenizer: Any) -> Any:
    """``{input_ids, labels}`` rows of the conversations (labels: the final assistant turn), from the cache when
    ``data.cache_dir`` is set (built by each node's first process, the others waiting for it)."""
    import datasets

    if cfg.data.cache_dir is None:
        return _build(cfg, tokenizer)[0]
    final = Path(cfg.data.cache_dir) / cache_key(cfg, tokenizer)
    if not (final / MARKER).is_file():
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            _build_into(cfg, tokenizer, final)
        else:
            wait_for(final / MARKER, "this node's first process tokenizes the conversations")
    info = json.loads((final / MARKER).read_text())
    log.info("data: %s (tokenized set %s)", info["report"], final)
    return datasets.load_from_disk(str(final))


def _build(cfg: TrainConfig, tokenizer: Any) -> tuple[Any, Any]:
    dataset, report = build_tokenized_dataset(
        load_rows(cfg), tokenizer, cfg.data.max_len, num_proc=cfg.data.num_proc
    )
    log.info("data: %s", report)
    return dataset, report


def _build_into(cfg: TrainConfig, tokenizer: Any, final: Path) -> None:
    """Tokenize into a private folder, then rename it to ``final`` (atomic: a reader sees all of it or nothing)."""
    dataset, report = _build(cfg, tokenizer)
    tmp = final.with_name(f"{final.name}.tmp-{os.uname().nodename}-{os.getpid()}")
    dataset.save_to_disk(str(tmp))
    (tmp / MARKER).write_text(json.dumps({"report": str(report), "rows": len(dataset)}) + "\n")
    try:
        os.rename(tmp, final)
    except OSError:  # another node's copy got there first: the same rows
        shutil.rmtree(tmp, ignore_errors=True)
