"""The training rows of stages sft and mars: the conversations (the synthetic task generated first when configured
and missing), tokenized with the chat template by :mod:`prove.data`. Stage distill trains on its generated set
instead (:func:`prove.train.distill.training_rows`) but draws its prompts from :func:`load_rows`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prove.data.build import build_tokenized_dataset
from prove.data.load import load_chat_dataset
from prove.data.synthetic import main as write_synthetic

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


def tokenized_dataset(cfg: TrainConfig, tokenizer: Any) -> Any:
    """``{input_ids, labels}`` rows of the conversations (labels: the final assistant turn)."""
    dataset, report = build_tokenized_dataset(
        load_rows(cfg), tokenizer, cfg.data.max_len, num_proc=cfg.data.num_proc
    )
    log.info("data: %s", report)
    return dataset
