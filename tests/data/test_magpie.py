"""prove.data.magpie: open-chat prompts sampled from a chat model's user-turn prefix — the filters, the suite
disjointness (a fixture prompt that copies an MT-bench question is dropped, or refuses the set), the held-out split,
determinism and resume, on a tiny in-process model (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prove.data import magpie
from prove.data.magpie import Filters, Sample
from prove.data.suites import ngram_set, shared_ngrams, suite_prompts

FIXTURES = Path(__file__).parent / "suites"
SOURCES = {"mt-bench": FIXTURES / "mt_bench_mini.jsonl", "humaneval": FIXTURES / "humaneval_mini.jsonl"}
# MT-bench's first fixture question, word for word inside a longer request: 14 shared words
OVERLAPPING = (
    "Please help: write a short note inviting a neighbour to a garden party on Saturday afternoon, thanks!"
)


@pytest.fixture(scope="module")
def suite():
    return suite_prompts(["mt-bench", "humaneval", "arithmetic"], SOURCES)


def _settings(**kw):
    return {"model": "fake", "prefix": "<|im_start|>user\n", "seed": 0, **kw}


def _fake_sampler(texts: list[str], batch_size: int = 4):
    """Batch b: texts[b * batch_size : (b + 1) * batch_size], all ended; records the batches asked for."""
    asked: list[int] = []

    def sample(b: int) -> list[Sample]:
        asked.append(b)
        return [Sample(t, True) for t in texts[b * batch_size : (b + 1) * batch_size]]

    sample.asked = asked  # type: ignore[attr-defined]
    return sample


GENERAL = [
    "What are three ways to keep basil growing on a sunny kitchen windowsill?",
    "Can you explain the difference between weather and climate to a ten year old?",
    "Suggest a name for a bakery that sells only sourdough bread.",
    "How do I politely decline a wedding invitation from a coworker?",
    "Write a haiku about the first snow of winter in a quiet town.",
    "What should I pack for a two day hike in the mountains in autumn?",
    "Give me a simple recipe for tomato soup without cream.",
    "Why do cats knock things off tables?",
]


def test_the_user_prefix_is_the_template_up_to_the_users_words(stock_tokenizer):
    """ChatML with its default system turn: the system turn, then <|im_start|>user\\n (fails if the prefix stops at
    the system turn, or carries the end of the user turn)."""
    assert magpie.user_prefix(stock_tokenizer) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    )
    ends = magpie.end_of_turn_ids(stock_tokenizer)
    assert stock_tokenizer.convert_tokens_to_ids("<|im_end|>") in ends


@pytest.mark.parametrize(
    ("text", "ended", "why"),
    [
        ("How do I bake bread at home?", False, "unfinished"),
        ("", True, "empty"),
        ("Hi there", True, "too_short"),
        (" ".join(f"w{i}" for i in range(200)), True, "too_long"),
        ("Tell me a joke.<|im_end|>\n<|im_start|>assistant\nSure", True, "markup"),
        ("What is love?\nassistant\nLove is", True, "markup"),
        ("please " * 30, True, "repetitive"),
        ("How do I bake bread at home?", True, None),
    ],
)
def test_each_trivial_kind_of_sample_is_dropped(text, ended, why):
    assert magpie.reason(magpie.clean(text), ended, Filters()) == why


def test_duplicates_and_near_duplicates_are_dropped_across_case_and_punctuation():
    long = "Could you list five easy indoor plants that survive with very little light and water please"
    sel = magpie.select(
        [
            Sample(long, True),
            Sample(long.upper() + "!!", True),  # the same words
            Sample("Hey, " + long.lower() + " and tell me why", True),  # 16 shared words: a 13-gram
            Sample("Could you list five easy indoor plants for a cold room?", True),  # 6 shared: kept
        ],
        need=10,
        filters=Filters(),
        suite={},
    )
    assert sel.kept == [long, "Could you list five easy indoor plants for a cold room?"]
    assert sel.dropped == {"duplicate": 1, "near_duplicate": 1}


def test_a_prompt_copying_a_suite_question_is_filtered_with_a_message(tmp_path, suite, caplog):
    """The deliberate overlap (MT-bench question 1 inside a request) is dropped and named, the set written from the
    others, and the written files share no 13-gram with any suite (fails if the suite check is not wired in, or
    checks only exact matches)."""
    assert shared_ngrams(suite, [OVERLAPPING])  # the fixture does overlap
    texts = [GENERAL[0], OVERLAPPING, *GENERAL[1:]]
    with caplog.at_level("WARNING", logger="prove.data.magpie"):
        manifest = magpie.build(
            _fake_sampler(texts),
            tmp_path,
            n=5,
            heldout=2,
            settings=_settings(),
            suite=suite,
            suite_names=["x"],
        )
    assert manifest["dropped"] == {"suite_overlap": 1} and manifest["suite_overlap"] == "none"
    assert "mt-bench/1" in caplog.text and "garden party" in caplog.text
    rows = _rows(tmp_path / "train.jsonl") + _rows(tmp_path / "heldout.jsonl")
    assert OVERLAPPING not in {r["messages"][0]["content"] for r in rows}
    assert shared_ngrams(suite, [r["messages"] for r in rows]) == []


def test_refuse_mode_writes_no_training_set_and_names_the_suite_prompt(tmp_path, suite):
    with pytest.raises(magpie.OverlapRefused, match=r"mt-bench/1.*--on-overlap filter"):
        magpie.build(
            _fake_sampler([GENERAL[0], OVERLAPPING, *GENERAL[1:]]),
            tmp_path,
            n=5,
            heldout=2,
            settings=_settings(),
            suite=suite,
            suite_names=["x"],
            on_overlap="refuse",
        )
    assert not (tmp_path / "train.jsonl").exists()


def test_too_few_prompts_is_an_error_naming_the_fix(tmp_path, suite):
    with pytest.raises(ValueError, match="--max-batches"):
        magpie.build(
            _fake_sampler(GENERAL),
            tmp_path,
            n=20,
            heldout=2,
            settings=_settings(),
            suite=suite,
            suite_names=["x"],
        )


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_held_out_prompts_are_disjoint_from_the_training_ones_and_the_split_is_seeded(tmp_path, suite):
    a = magpie.build(_fake_sampler(GENERAL), tmp_path / "a", n=6, heldout=2, settings=_settings(), suite=suite,
                     suite_names=["x"])  # fmt: skip
    train, held = _rows(tmp_path / "a" / "train.jsonl"), _rows(tmp_path / "a" / "heldout.jsonl")
    assert (a["train"], a["heldout"]) == (6, 2) and len(train) == 6 and len(held) == 2
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    grams = set().union(*(ngram_set(r["messages"][0]["content"], 13) for r in train))
    assert not any(ngram_set(r["messages"][0]["content"], 13) & grams for r in held)
    assert all(r["messages"][0]["role"] == "user" and r["category"] == "magpie" for r in train + held)
    magpie.build(_fake_sampler(GENERAL), tmp_path / "b", n=6, heldout=2, settings=_settings(), suite=suite,
                 suite_names=["x"])  # fmt: skip
    assert (tmp_path / "b" / "heldout.jsonl").read_text() == (tmp_path / "a" / "heldout.jsonl").read_text()
    magpie.build(_fake_sampler(GENERAL), tmp_path / "c", n=6, heldout=2, settings=_settings(seed=1), suite=suite,
                 suite_names=["x"])  # fmt: skip
    assert (tmp_path / "c" / "heldout.jsonl").read_text() != (tmp_path / "a" / "heldout.jsonl").read_text()


def test_a_killed_run_resumes_after_its_last_whole_batch(tmp_path, suite):
    """Batches 0-1 sampled, then a kill mid-write of batch 2: the rerun reads 0-1 from raw.jsonl, samples from batch
    2 on, and writes the same set as an uninterrupted run; other sampling settings are refused."""
    whole = tmp_path / "whole"
    magpie.build(_fake_sampler(GENERAL, 2), whole, n=5, heldout=2, settings=_settings(), suite=suite, suite_names=["x"])  # fmt: skip
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (whole / "raw.jsonl").read_text().splitlines(keepends=True)
    (cut / "raw.jsonl").write_text("".join(lines[:2]) + lines[2][:15])  # a half-written third batch
    (cut / "sampling.json").write_text((whole / "sampling.json").read_text())
    sampler = _fake_sampler(GENERAL, 2)
    magpie.build(sampler, cut, n=5, heldout=2, settings=_settings(), suite=suite, suite_names=["x"])
    assert sampler.asked[0] == 2  # batches 0 and 1 were not sampled again
    for name in ("train.jsonl", "heldout.jsonl", "raw.jsonl"):
        assert (cut / name).read_text() == (whole / name).read_text()
    with pytest.raises(ValueError, match="other settings"):
        magpie.build(sampler, cut, n=5, heldout=2, settings=_settings(seed=3), suite=suite, suite_names=["x"])


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory, stock_tokenizer):
    """A tiny random Qwen2 chat model saved as a folder, its tokenizer the in-process ChatML BPE."""
    from tests.conftest import make_qwen2

    folder = tmp_path_factory.mktemp("tiny-chat")
    eos = stock_tokenizer.convert_tokens_to_ids("<|im_end|>")
    make_qwen2(
        len(stock_tokenizer), eos_token_id=eos, pad_token_id=stock_tokenizer.pad_token_id
    ).save_pretrained(folder)
    stock_tokenizer.save_pretrained(folder)
    return folder


def test_the_command_samples_a_tiny_model_deterministically_and_skips_a_finished_set(
    tmp_path, tiny_chat_model, capsys
):
    """The recipe's data step on a tiny model: the user turns are sampled from the template's prefix, filtered,
    split and checked against the suites (the fixture files and the generated arithmetic); the same seed writes the
    same files; a finished set is not sampled again."""
    args = [
        "--model", str(tiny_chat_model), "--n", "4", "--heldout", "2", "--seed", "7", "--batch-size", "8",
        "--max-new-tokens", "400", "--min-words", "1", "--max-words", "1000",
        "--suite", "mt-bench", "humaneval", "arithmetic",
        "--suite-source", f"mt-bench={SOURCES['mt-bench']}", f"humaneval={SOURCES['humaneval']}",
    ]  # fmt: skip
    assert magpie.main([*args, "--out", str(tmp_path / "a")]) == 0
    manifest = json.loads((tmp_path / "a" / "magpie.json").read_text())
    assert manifest["complete"] and (manifest["train"], manifest["heldout"]) == (4, 2)
    assert manifest["sampling"]["prefix"].endswith("<|im_start|>user\n")
    raw = [json.loads(x) for x in (tmp_path / "a" / "raw.jsonl").read_text().splitlines()]
    assert manifest["samples_read"] <= 8 * len(raw) and len(raw[0]["samples"]) == 8
    assert magpie.main([*args, "--out", str(tmp_path / "b")]) == 0
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    before = (tmp_path / "a" / "raw.jsonl").stat().st_mtime_ns
    capsys.readouterr()
    assert magpie.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "a finished set" in capsys.readouterr().out
    assert (tmp_path / "a" / "raw.jsonl").stat().st_mtime_ns == before
