"""build_tokenized_dataset: datasets.map over tokenize_conversation, skipped rows counted, clear errors."""

from __future__ import annotations

import copy
import json

import datasets
import pytest
from prove.data.build import build_tokenized_dataset
from prove.data.chat import SkipReport, tokenize_conversation
from prove.data.conversations import load_chat_dataset


@pytest.fixture(scope="module")
def sample(sample_path):
    return datasets.Dataset.from_list([json.loads(line) for line in sample_path.read_text().splitlines()])


def test_sample_rows_are_tokenized_and_bad_rows_counted(sample, tokenizer):
    out, report = build_tokenized_dataset(sample, tokenizer, max_len=4096)
    assert out.column_names == ["input_ids", "labels"]
    assert report.skipped == {
        "missing_content": 1,
        "unknown_role": 1,
        "last_not_assistant": 1,
        "empty_response": 1,
        "bad_function_calls": 1,
        "bad_functions": 1,
    }
    assert (report.total, report.kept, len(out)) == (55, 49, 49)
    # Row for row what tokenize_conversation gives.
    expected = [tokenize_conversation(tokenizer, m, 4096) for m in sample["messages"]]
    assert [dict(r) for r in out] == [e for e in expected if e is not None]


def test_truncation_and_long_prompts_are_reported(sample, tokenizer):
    out, report = build_tokenized_dataset(sample, tokenizer, max_len=96)
    direct = SkipReport()
    for messages in sample["messages"]:
        tokenize_conversation(tokenizer, messages, 96, report=direct)
    assert report == direct and report.skipped["prompt_too_long"] > 0 and report.truncated > 0
    assert max(len(ids) for ids in out["input_ids"]) == 96


def test_parallel_map_matches_serial(sample, tokenizer):
    serial, r1 = build_tokenized_dataset(sample, tokenizer, 256)
    parallel, r2 = build_tokenized_dataset(sample, tokenizer, 256, num_proc=2)
    assert (
        serial["input_ids"] == parallel["input_ids"] and serial["labels"] == parallel["labels"] and r1 == r2
    )


def test_on_disk_dataset_reuses_the_cache(sample_path, tokenizer):
    ds = load_chat_dataset(str(sample_path))
    first, r1 = build_tokenized_dataset(ds, tokenizer, 256)
    second, r2 = build_tokenized_dataset(ds, tokenizer, 256)
    assert first.cache_files and first.cache_files == second.cache_files and r1 == r2


def test_no_usable_rows_names_the_fix(tokenizer):
    ds = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    with pytest.raises(ValueError, match=r"no usable rows.*last_not_assistant 3.*data\.path"):
        build_tokenized_dataset(ds, tokenizer, 64)
    with pytest.raises(ValueError, match="no usable rows"):
        build_tokenized_dataset(ds.select([]), tokenizer, 64)


def test_missing_messages_column(tokenizer):
    with pytest.raises(ValueError, match="no 'messages' column"):
        build_tokenized_dataset(datasets.Dataset.from_list([{"text": "hi"}]), tokenizer, 64)


def test_no_chat_template(sample, tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="has no chat template.*data.chat_template=chatml"):
        build_tokenized_dataset(sample, tok, 64)
