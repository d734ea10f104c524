"""A GGUF file as a model source (prove.data.gguf through prove.data.loading): a tiny Llama written in-process,
loaded as a folder converted once and cached, with the source model's logits and tokenizer."""

from __future__ import annotations

import json
import os

import pytest
import torch
from prove.data import gguf, loading

from tests.gguf_helpers import tiny_llama, write_tiny_gguf

pytest.importorskip("gguf")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(gguf.CACHE_ENV, str(root))
    return root / "gguf"


@pytest.fixture(scope="module")
def source(tmp_path_factory, stock_tokenizer):
    """A tiny Llama (untied head, so both matrices travel) and its GGUF file, alone in its folder."""
    folder = tmp_path_factory.mktemp("site-packages")
    model = tiny_llama(stock_tokenizer, tie=False)
    return model, write_tiny_gguf(folder / "tiny.Q.gguf", model, stock_tokenizer)


def test_loads_with_the_source_logits_and_tokenizer(source, cache, stock_tokenizer):
    model, path = source
    loaded = loading.load_model(str(path), "float32", device="cpu")
    tok = loading.load_tokenizer(str(path))
    assert "quantization_config" not in loaded.config.to_dict()
    text = "Ana has 3 pens and gets 4 more. How many pens does Ana have? The answer is 7."
    ids = stock_tokenizer(text, return_tensors="pt")["input_ids"]
    assert tok(text)["input_ids"] == ids[0].tolist()
    assert tok.eos_token == stock_tokenizer.eos_token and tok.pad_token_id == stock_tokenizer.pad_token_id
    assert tok.chat_template == stock_tokenizer.chat_template
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5
        )


def test_converted_once_into_a_cache_keyed_by_the_file(source, cache, monkeypatch):
    _, path = source
    first = loading.model_folder(str(path))
    assert first.startswith(str(cache)) and (cache / os.path.basename(first) / "config.json").is_file()
    record = json.loads((cache / os.path.basename(first) / gguf.RECORD).read_text())
    assert record["source"] == str(path.resolve()) and record["architecture"] == "llama"

    def refuse(*_args, **_kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert", refuse)
    assert loading.model_folder(str(path)) == first  # the second load hits the cache
    loading.load_tokenizer(str(path))
    assert [p.name for p in cache.iterdir()] == [os.path.basename(first)]  # no temporary folder left
    # nothing written beside the file (its folder may be read-only, e.g. site-packages)
    assert list(path.parent.iterdir()) == [path]


def test_a_changed_file_converts_again(tmp_path, cache, stock_tokenizer):
    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama(stock_tokenizer, seed=1), stock_tokenizer)
    first = gguf.cached_folder(path)
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))
    assert gguf.cached_folder(path) != first
    other = write_tiny_gguf(
        tmp_path / "copy" / "m.gguf", tiny_llama(stock_tokenizer, seed=1), stock_tokenizer
    )
    assert gguf.cached_folder(other) != gguf.cached_folder(path)  # the same name elsewhere: its own folder


def test_a_converted_model_saves_and_trains_like_any_checkpoint(source, cache, tmp_path):
    _, path = source
    model = loading.load_model(str(path), "float32")
    model.save_pretrained(tmp_path / "saved")  # a model read straight from GGUF refuses this
    model.train()
    loss = model(input_ids=torch.tensor([[5, 9, 17, 40]]), labels=torch.tensor([[5, 9, 17, 40]])).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_missing_gguf_file_is_a_user_error(tmp_path):
    with pytest.raises(ValueError, match=r"no model at .*nope.gguf"):
        loading.check_source("models/nope.gguf", "pass a file")  # looks like a hub id, but a .gguf is a file
    with pytest.raises(ValueError, match="no GGUF file at"):
        loading.model_folder(str(tmp_path / "nope.gguf"))


def test_gguf_file_inside_a_folder_is_located(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    assert gguf.locate(str(tmp_path), "m.gguf") == str(tmp_path / "m.gguf")
    assert gguf.locate("org/repo", str(tmp_path / "m.gguf")) == str(tmp_path / "m.gguf")
    assert gguf.is_gguf("a/B.GGUF") and not gguf.is_gguf("a/b") and not gguf.is_gguf(None)


def test_a_conversion_another_process_finished_first_is_used(source, cache, monkeypatch):
    """Two ranks convert the same file at once: the one that renames second keeps the first one's folder."""
    import shutil

    _, path = source
    real = gguf.convert

    def convert_while_another_finishes(file, tmp):
        real(file, tmp)
        shutil.copytree(tmp, gguf.cached_folder(file))  # the other process's rename lands first
        (gguf.cached_folder(file) / "theirs").write_text("")
        return tmp

    monkeypatch.setattr(gguf, "convert", convert_while_another_finishes)
    out = gguf.hf_folder(path)
    assert (out / "theirs").is_file() and [p.name for p in cache.iterdir()] == [out.name]


def test_cli_prints_the_converted_folder(source, cache, capsys):
    _, path = source
    gguf.main([str(path)])
    assert capsys.readouterr().out.strip() == str(gguf.cached_folder(path))
    with pytest.raises(ValueError, match="no installed package 'no_such_pkg'"):
        gguf.main(["no_such_pkg/m.gguf"])


def test_package_file_finds_a_file_without_importing_the_package():
    import json
    import sys
    from pathlib import Path

    assert gguf.package_file("json/decoder.py") == str(Path(json.__file__).parent / "decoder.py")
    with pytest.raises(ValueError, match="json has no nope.gguf"):
        gguf.package_file("json/nope.gguf")
    with pytest.raises(ValueError, match="write <package>/<file>"):
        gguf.package_file("json")
    assert "no_such_pkg" not in sys.modules


def test_gguf_file_in_a_hub_repo_is_downloaded_through_the_hub_cache(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, filename):
        calls.append((repo_id, filename))
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert gguf.locate("org/repo", "m.Q4.gguf") == str(tmp_path / "m.Q4.gguf")
    assert calls == [("org/repo", "m.Q4.gguf")]
