"""load_chat_dataset: local JSONL / JSON / parquet / globs / folders / save_to_disk, and errors that name the fix."""

from __future__ import annotations

import json

import datasets
import pytest
from prove.data.conversations import load_chat_dataset

ROWS = [
    {
        "id": f"r{i}",
        "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
    }
    for i in range(6)
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _messages(ds):
    return [r["messages"] for r in ds]


def test_jsonl_file(tmp_path):
    ds = load_chat_dataset(str(_write_jsonl(tmp_path / "d.jsonl", ROWS)))
    assert _messages(ds) == [r["messages"] for r in ROWS]


def test_json_array_file(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(ROWS), encoding="utf-8")
    assert len(load_chat_dataset(str(tmp_path / "d.json"))) == len(ROWS)


def test_parquet_file(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "d.parquet"))
    assert _messages(load_chat_dataset(str(tmp_path / "d.parquet"))) == [r["messages"] for r in ROWS]


def test_folder_and_glob_of_shards(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", ROWS[:3])
    (tmp_path / "sub").mkdir()
    _write_jsonl(tmp_path / "sub" / "b.jsonl", ROWS[3:])
    (tmp_path / "README.txt").write_text("not data")
    assert len(load_chat_dataset(str(tmp_path))) == len(ROWS)
    assert len(load_chat_dataset(str(tmp_path / "*.jsonl"))) == 3


def test_save_to_disk_dataset_and_dict(tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "one"))
    assert _messages(load_chat_dataset(str(tmp_path / "one"))) == [r["messages"] for r in ROWS]
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    assert len(load_chat_dataset(str(tmp_path / "dict"), split="test")) == 1
    with pytest.raises(ValueError, match="set data.split"):
        load_chat_dataset(str(tmp_path / "dict"), split="validation")


def test_num_rows(tmp_path):
    path = str(_write_jsonl(tmp_path / "d.jsonl", ROWS))
    assert [r["id"] for r in load_chat_dataset(path, num_rows=2)] == ["r0", "r1"]
    assert len(load_chat_dataset(path, num_rows=100)) == len(ROWS)
    with pytest.raises(ValueError, match="num_rows"):
        load_chat_dataset(path, num_rows=0)


def test_shipped_sample(sample_path):
    ds = load_chat_dataset(str(sample_path))
    assert len(ds) == 55 and {"id", "source", "messages"} <= set(ds.column_names)


@pytest.mark.parametrize("missing", ["missing.jsonl", "no/such/dir/", "./nope", "shards/*.parquet"])
def test_missing_path_names_the_fix(tmp_path, missing):
    with pytest.raises(ValueError, match=r"no dataset at .*data\.path=<jsonl/parquet/dir> or a hub id"):
        load_chat_dataset(str(tmp_path / missing))


def test_unreachable_hub_id_names_the_fix():
    """Tests run offline: a hub id that is not cached fails fast with the same advice."""
    with pytest.raises(ValueError, match=r"no dataset at 'allenai/not-a-dataset'.*data\.path="):
        load_chat_dataset("allenai/not-a-dataset")


def test_empty_folder_and_unsupported_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no dataset at"):
        load_chat_dataset(str(tmp_path / "empty"))
    (tmp_path / "d.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_chat_dataset(str(tmp_path / "d.csv"))


def test_mixed_formats_rejected(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", ROWS)
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(ValueError, match="cannot mix"):
        load_chat_dataset(str(tmp_path))


def test_rows_without_messages_rejected(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi", "completion": "hello"}])
    with pytest.raises(ValueError, match="no `messages` column"):
        load_chat_dataset(str(path))
