"""The tiny arithmetic task (docs/design.md §5): deterministic, correct, disjoint splits, checkable answers."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from prove.data.synthetic import (
    MAX_OPERAND,
    as_prompt,
    extract_answer,
    generate_arithmetic,
    main,
    question_of,
    score,
    split_rows,
)


@pytest.fixture(scope="module")
def rows():
    return generate_arithmetic(2000, seed=0)


def test_deterministic_in_seed(rows):
    assert generate_arithmetic(2000, seed=0) == rows
    assert generate_arithmetic(50, seed=1) != rows[:50]
    assert generate_arithmetic(50, seed=0) == rows[:50]


def test_schema_and_distinct_questions(rows):
    assert all(
        [m["role"] for m in r["messages"]] == ["user", "assistant"] and isinstance(r["answer"], str)
        for r in rows
    )
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({question_of(r) for r in rows}) == len(rows)


def test_answers_recomputed_from_the_question(rows):
    """Gains say "N more", losses do not: replay the question's numbers and compare."""
    steps_seen = set()
    for row in rows:
        numbers = re.findall(r"(\d+)( more)?", question_of(row))
        total = int(numbers[0][0])
        for n, more in numbers[1:]:
            assert 1 <= int(n) <= MAX_OPERAND
            total += int(n) if more else -int(n)
            assert total >= 0, question_of(row)
        assert str(total) == row["answer"], question_of(row)
        steps_seen.add(len(numbers) - 1)
    assert steps_seen == {2, 3}


def test_reasoning_equations_hold_and_end_in_the_answer(rows):
    for row in rows:
        reasoning = row["messages"][1]["content"]
        equations = re.findall(r"(\d+) ([+-]) (\d+) = (\d+)", reasoning)
        assert len(equations) in (2, 3)
        for a, op, b, c in equations:
            assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(c)
        assert equations[-1][3] == row["answer"]
        assert extract_answer(reasoning) == row["answer"] and score(reasoning, row["answer"])


def test_split_is_disjoint(rows):
    train, test = split_rows(rows, 300, seed=0)
    assert (len(train), len(test)) == (1700, 300)
    assert not {question_of(r) for r in train} & {question_of(r) for r in test}
    assert split_rows(rows, 300, seed=0) == (train, test)
    with pytest.raises(ValueError, match="test_size"):
        split_rows(rows, 5000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so 19 - 5 = 14. The answer is 14.", "14"),
        ("the answer is -3", "-3"),
        ("The answer is: 1,234.", "1234"),
        ("The answer is 2.5 apples", "2.5"),
        ("The answer is 3. Wait, no. The answer is 4.", "4"),
        ("I think it is 14.", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_score():
    assert score("... The answer is 14.", "14")
    assert score("The answer is 14.", 14)
    assert score("The answer is 14.0", "14")
    assert not score("The answer is 15.", "14")
    assert not score("14", "14")  # no "The answer is": not checkable, not credited


def test_cli_writes_train_and_heldout_prompts(tmp_path):
    main(["--out", str(tmp_path), "--n", "60", "--test-size", "15", "--seed", "3"])
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert (len(train), len(test)) == (60, 15)
    assert all(
        [m["role"] for m in r["messages"]] == ["user"] and r["answer"] and "prompt" not in r for r in test
    )
    assert not {question_of(r) for r in train} & {question_of(r) for r in test}
    assert as_prompt(train[0])["messages"] == train[0]["messages"][:1]


def test_cli_runs_as_a_module(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "prove.data.synthetic", "--out", str(tmp_path), "--n", "10", "--test-size", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "wrote 10 training rows" in result.stdout
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 2
