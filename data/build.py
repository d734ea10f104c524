"""Tokenize a whole chat dataset for training: ``datasets.map`` over :func:`prove.data.chat.encode_conversation`.

The result has two columns, ``input_ids`` and ``labels`` (prompt masked to -100), one conversation per
row. Padding to a multiple of K and MARS's ``[noisy | clean]`` input are the trainer's job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prove.data.chat import SkipReport, encode_conversation, ensure_chat_template

if TYPE_CHECKING:
    import datasets


def build_tokenized_dataset(
    dataset: datasets.Dataset,
    tokenizer: Any,
    max_len: int,
    *,
    num_proc: int = 1,
    messages_field: str = "messages",
    load_from_cache_file: bool = True,
) -> tuple[datasets.Dataset, SkipReport]:
    """Tokenize every conversation of ``dataset``; returns ``(tokenized dataset, report)``.

    Args:
        dataset: rows in the Dolci schema (see :func:`prove.data.conversations.load_chat_dataset`).
        tokenizer: a tokenizer with a chat template (:func:`prove.data.chat.ensure_chat_template`).
        max_len: longest example kept; longer ones are right-truncated, and a prompt this long drops the row.
        num_proc: worker processes for ``datasets.map``.
        messages_field: the column holding the conversation.
        load_from_cache_file: reuse ``datasets``' cache of an earlier identical map (on-disk datasets only).

    Raises:
        ValueError: no ``messages_field`` column, no chat template, or no usable row.
    """
    import datasets

    ensure_chat_template(tokenizer)
    check_columns(dataset, messages_field)
    mapped = dataset.map(
        _encode_batch,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "max_len": max_len, "messages_field": messages_field},
        remove_columns=dataset.column_names,
        features=datasets.Features(
            {
                "input_ids": datasets.List(datasets.Value("int32")),
                "labels": datasets.List(datasets.Value("int32")),
                "skip_reason": datasets.Value("string"),
                "truncated": datasets.Value("bool"),
            }
        ),
        num_proc=max(1, min(num_proc, len(dataset))),
        load_from_cache_file=load_from_cache_file,
        desc="Tokenizing conversations",
    )
    reasons = mapped["skip_reason"]
    report = skip_report(reasons, mapped["truncated"])
    kept = mapped.select([i for i, reason in enumerate(reasons) if reason is None])
    return kept.remove_columns(["skip_reason", "truncated"]), report


def check_columns(dataset: datasets.Dataset, messages_field: str) -> None:
    """Refuse, with the fix, a dataset without the conversation column or without rows."""
    if messages_field not in dataset.column_names:
        raise ValueError(
            f"the dataset has no {messages_field!r} column (columns: {dataset.column_names}): "
            "rows must follow the Dolci chat schema, messages=[{role, content}, ...]"
        )
    if len(dataset) == 0:
        raise ValueError(
            "no usable rows to train on: the dataset is empty; check data.path and data.num_rows"
        )


def skip_report(reasons: list[str | None], truncated: list[bool]) -> SkipReport:
    """Why rows were dropped or cut; refuses a dataset none of whose rows survived."""
    report = SkipReport()
    for reason, cut in zip(reasons, truncated, strict=True):
        report.add(reason, truncated=cut)
    if report.kept == 0:
        raise ValueError(
            f"no usable rows to train on ({report}): point data.path at Dolci-schema conversations that end "
            "with an assistant turn, or raise data.max_len if the prompts are too long"
        )
    return report


def _encode_batch(
    batch: dict[str, list], tokenizer: Any, max_len: int, messages_field: str
) -> dict[str, list]:
    out: dict[str, list] = {"input_ids": [], "labels": [], "skip_reason": [], "truncated": []}
    for messages in batch[messages_field]:
        encoded, reason, truncated = encode_conversation(tokenizer, messages, max_len)
        out["input_ids"].append(encoded["input_ids"] if encoded else [])
        out["labels"].append(encoded["labels"] if encoded else [])
        out["skip_reason"].append(reason)
        out["truncated"].append(truncated)
    return out
