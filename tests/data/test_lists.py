"""The list-function task (prove.data.lists) and the task mixture of prove.data.synthetic: deterministic, the replies'
code computes their answers, answers are checkable and never the input, splits disjoint per task."""

from __future__ import annotations

import ast
import json
import re

import pytest
from prove.data.lists import OPERATIONS, extract_list, generate_lists, score_list
from prove.data.synthetic import (
    INSTRUCTION,
    generate_arithmetic,
    generate_tasks,
    main,
    question_of,
    score,
    split_rows,
)


@pytest.fixture(scope="module")
def rows():
    return generate_lists(1500, seed=0)


def test_deterministic_in_seed(rows):
    assert generate_lists(1500, seed=0) == rows
    assert generate_lists(50, seed=1) != rows[:50]
    assert generate_lists(50, seed=0) == rows[:50]


def test_schema_distinct_questions_and_every_operation(rows):
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
    assert len({r["id"] for r in rows}) == len({question_of(r) for r in rows}) == len(rows)
    names = {re.search(r"def (\w+)\(", r["messages"][1]["content"]).group(1) for r in rows}
    prefixes = {op.name.split("{")[0] for op in OPERATIONS}
    assert {max((p for p in prefixes if n.startswith(p)), key=len) for n in names} == prefixes


def test_the_replys_function_computes_the_answer_and_it_is_not_the_input(rows):
    """Run the code each reply writes on the list the question gives: it must return the row's answer."""
    for row in rows:
        question, reply = question_of(row), row["messages"][1]["content"]
        code = re.search(r"```python\n(.*?)\n```", reply, re.DOTALL).group(1)
        name = re.search(r"def (\w+)\(", code).group(1)
        xs = ast.literal_eval(re.search(r"\[[\d, ]*\]", question).group(0))
        scope: dict = {}
        exec(code, scope)
        answer = ast.literal_eval(row["answer"])
        assert scope[name](list(xs)) == answer, (question, code)
        assert answer and answer != xs and 3 <= len(xs) <= 7, question
        assert reply.endswith(f"The answer is {answer}.") and score(reply, row["answer"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so it returns [1, 2]. The answer is [3, 4].", [3, 4]),
        ("print(f([3, 8, 1]))  # Output: [1, 8, 3]", [1, 8, 3]),  # no "answer is": the last list written
        ("The answer is: [ 5 ,6, ]", [5, 6]),
        ("The answer is []", []),
        ("The answer is [-1, 2]", [-1, 2]),
        ("it returns ['a', 'b']", None),
        ("no list here", None),
        ("", None),
    ],
)
def test_extract_list(text, expected):
    assert extract_list(text) == expected


def test_score_dispatches_on_the_answer_kind():
    assert score("... returns [6, 1, 8, 3].", "[6, 1, 8, 3]")
    assert not score("... returns [6, 1, 8].", "[6, 1, 8, 3]")
    assert not score_list("print(reverse_list([3, 8, 1, 6]))", "[6, 1, 8, 3]")  # an echo of the input
    assert score("The answer is 14.", "14") and not score("[14]", "14")  # numeric answers as before


def test_one_task_alone_is_exactly_its_own_rows():
    train, tests = generate_tasks(["arithmetic"], 300, 20, seed=0)
    assert (train, tests["arithmetic"]) == split_rows(generate_arithmetic(320, 0), 20, 0)


def test_mixture_splits_each_task_and_shuffles_them_together():
    train, tests = generate_tasks(["arithmetic", "lists"], 101, 11, seed=2, instruct=True)
    assert len(train) == 101 and {k: len(v) for k, v in tests.items()} == {"arithmetic": 6, "lists": 5}
    kinds = [r["id"].split("-")[0] for r in train]
    assert kinds.count("arith") == 51 and kinds.count("lists") == 50
    assert "lists" in kinds[:10] and "arith" in kinds[:10]  # any first rows mix the kinds
    held_out = {question_of(r) for t in tests.values() for r in t}
    assert not held_out & {question_of(r) for r in train}
    assert all(question_of(r).endswith(INSTRUCTION) for r in train if r["id"].startswith("arith"))
    with pytest.raises(ValueError, match="use one or more of"):
        generate_tasks(["arithmetic", "poems"], 10, 2)
    with pytest.raises(ValueError, match="name each task once"):
        generate_tasks(["lists", "lists"], 10, 2)


def test_cli_writes_the_mixture_and_a_prompt_file_per_task(tmp_path):
    main(
        [
            "--out",
            str(tmp_path),
            "--n",
            "40",
            "--test-size",
            "10",
            "--tasks",
            "arithmetic,lists",
            "--instruct",
        ]
    )
    read = lambda name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    train, test = read("train.jsonl"), read("test.jsonl")
    arith, lists = read("test-arithmetic.jsonl"), read("test-lists.jsonl")
    assert (len(train), len(test), len(arith), len(lists)) == (40, 10, 5, 5)
    assert test == arith + lists
    assert all(r["answer"].startswith("[") for r in lists) and all(r["answer"].isdigit() for r in arith)
    assert all([m["role"] for m in r["messages"]] == ["user"] for r in test)
