"""The tiny task of docs/design.md §5: generated 2–3-step arithmetic word problems with templated reasoning.

    user:      Mia has 8 apples. She buys 7 more and gives away 5. How many apples does Mia have now?
    assistant: Mia starts with 8 apples. She buys 7, so 8 + 7 = 15. She gives away 5, so 15 - 5 = 10.
               The answer is 10.

Given numbers are 1–9 (the start 2–9), every running total stays non-negative, and the answer is
checkable with :func:`score`. Rows follow the Dolci schema (``messages``) plus ``answer`` and ``id``;
everything is a deterministic function of the seed.

    python -m prove.data.synthetic --out data/tiny --n 20000 --test-size 500 --seed 0

writes ``train.jsonl`` (user + assistant turns) and ``test.jsonl`` (held-out questions: ``messages`` =
the user turn only, plus ``answer``), the prompt file prove-decode and prove-bench read.

Other generated tasks join it by name (:data:`TASKS`): ``lists``, short Python list-manipulation requests
(:mod:`prove.data.lists`). ``--tasks arithmetic,lists`` writes a mixture, shuffled together, with the held-out
prompts of each task also in ``test-<task>.jsonl``; ``--instruct`` phrases the arithmetic questions for a
pretrained chat model answering in its own words (think step by step, finish with "The answer is"), which the
tiny task's templated replies do not need. :func:`score` checks either kind of answer.

    python -m prove.data.synthetic --out runs/data/mix --n 4000 --test-size 200 --tasks arithmetic,lists --instruct
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prove.data.lists import generate_lists, score_list

NAMES = [
    ("Mia", "She"), ("Leo", "He"), ("Ava", "She"), ("Omar", "He"), ("Zoe", "She"), ("Ravi", "He"),
    ("Lena", "She"), ("Theo", "He"), ("Nora", "She"), ("Sam", "He"), ("Ivy", "She"), ("Max", "He"),
    ("Aria", "She"), ("Ben", "He"), ("Maya", "She"), ("Noah", "He"), ("Elsa", "She"), ("Finn", "He"),
    ("Hana", "She"), ("Kai", "He"),
]  # fmt: skip
OBJECTS = [
    "apples", "marbles", "stickers", "coins", "pencils", "books", "cookies", "shells", "cards",
    "balloons", "stamps", "buttons", "flowers", "eggs", "candies", "crayons",
]  # fmt: skip
# (question phrase, reasoning phrase); {n} is the operand.
GAINS = [
    ("buys {n} more", "buys {n}"),
    ("finds {n} more", "finds {n}"),
    ("gets {n} more from a friend", "gets {n}"),
    ("wins {n} more", "wins {n}"),
    ("picks up {n} more", "picks up {n}"),
    ("is given {n} more", "is given {n}"),
]
LOSSES = [
    ("gives away {n}", "gives away {n}"),
    ("loses {n}", "loses {n}"),
    ("sells {n}", "sells {n}"),
    ("gives {n} to a friend", "gives {n} to a friend"),
    ("trades away {n}", "trades away {n}"),
    ("uses {n}", "uses {n}"),
]
OPENINGS = ["{name} has {a} {obj}.", "{name} starts with {a} {obj}.", "{name} owns {a} {obj}."]
QUESTIONS = [
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
    "How many {obj} does {name} end up with?",
]
MAX_OPERAND = 9
INSTRUCTION = 'Think step by step, then finish with "The answer is" and the number.'
"""What ``instruct`` appends to an arithmetic question (a pretrained chat model then ends on a checkable line)."""
_ANSWER_RE = re.compile(r"answer is:?\s*\$?\s*(-?[\d,]*\d(?:\.\d+)?)", re.IGNORECASE)


def make_problem(rng: random.Random, steps: int) -> tuple[str, str, int]:
    """One problem with ``steps`` operations: ``(question, reasoning, answer)``."""
    name, pronoun = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    total = rng.randint(2, MAX_OPERAND)
    question = [rng.choice(OPENINGS).format(name=name, a=total, obj=obj)]
    reasoning = [f"{name} starts with {total} {obj}."]
    actions = []
    for _ in range(steps):
        gain = total == 0 or rng.random() < 0.5
        n = rng.randint(1, MAX_OPERAND if gain else min(MAX_OPERAND, total))
        asked, told = rng.choice(GAINS if gain else LOSSES)
        new = total + n if gain else total - n
        actions.append(asked.format(n=n))
        reasoning.append(f"{pronoun} {told.format(n=n)}, so {total} {'+' if gain else '-'} {n} = {new}.")
        total = new
    if steps == 2:
        question.append(f"{pronoun} {actions[0]} and {actions[1]}.")
    else:
        question.append(f"{pronoun} {', '.join(actions[:-1])}, and then {actions[-1]}.")
    question.append(rng.choice(QUESTIONS).format(name=name, obj=obj))
    reasoning.append(f"The answer is {total}.")
    return " ".join(question), " ".join(reasoning), total


def generate_arithmetic(n: int, seed: int = 0, instruct: bool = False) -> list[dict[str, Any]]:
    """``n`` rows with distinct questions, deterministic in ``seed``.

    Each row: ``{"id", "messages": [user, assistant], "answer": str}``; half the problems have 2 steps,
    half 3 (drawn at random). ``instruct`` appends :data:`INSTRUCTION` to every question.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < n:
        question, reasoning, answer = make_problem(rng, rng.choice((2, 3)))
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "id": f"arith-{seed}-{len(rows):06d}",
                "messages": [
                    {"role": "user", "content": f"{question} {INSTRUCTION}" if instruct else question},
                    {"role": "assistant", "content": reasoning},
                ],
                "answer": str(answer),
            }
        )
    return rows


TASKS: dict[str, Callable[[int, int, bool], list[dict[str, Any]]]] = {
    "arithmetic": generate_arithmetic,
    "lists": lambda n, seed, instruct: generate_lists(n, seed),  # its requests need no instruction
}
"""The generated tasks by name: ``(n, seed, instruct) -> rows``."""


def generate_tasks(
    tasks: list[str], n: int, test_size: int, seed: int = 0, instruct: bool = False
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """``(train, {task: test})``: ``n`` training rows and ``test_size`` held-out rows split evenly over ``tasks``
    (the first tasks take the remainder), each task split on its own; the training rows of several tasks are
    shuffled together (seeded), so any first N rows mix them. One task alone gives exactly its own rows."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"tasks={tasks}: use one or more of {sorted(TASKS)}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks={tasks}: name each task once")
    train: list[dict[str, Any]] = []
    tests: dict[str, list[dict[str, Any]]] = {}
    for i, task in enumerate(tasks):
        n_i = n // len(tasks) + (i < n % len(tasks))
        t_i = test_size // len(tasks) + (i < test_size % len(tasks))
        rows = TASKS[task](n_i + t_i, seed, instruct)
        task_train, tests[task] = split_rows(rows, t_i, seed)
        train += task_train
    if len(tasks) > 1:
        random.Random(seed).shuffle(train)
    return train, tests


def question_of(row: dict[str, Any]) -> str:
    """The user question of a row (its first user turn)."""
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


def split_rows(
    rows: list[dict[str, Any]], test_size: int, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, test)``: ``test_size`` distinct questions held out; no question is in both."""
    questions = list(dict.fromkeys(question_of(r) for r in rows))
    if not 0 <= test_size <= len(questions):
        raise ValueError(
            f"test_size must be between 0 and {len(questions)} distinct questions (got {test_size})"
        )
    held_out = set(random.Random(seed).sample(questions, test_size))
    train = [r for r in rows if question_of(r) not in held_out]
    test = [r for r in rows if question_of(r) in held_out]
    return train, test


def as_prompt(row: dict[str, Any]) -> dict[str, Any]:
    """A held-out row as a prompt record: ``messages`` without the final assistant turn, plus ``answer``."""
    messages = row["messages"][:-1] if row["messages"][-1]["role"] == "assistant" else row["messages"]
    return {"id": row["id"], "messages": messages, "answer": row["answer"]}


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8), creating parent folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def extract_answer(text: str) -> str | None:
    """The number after the last "The answer is", without thousands separators; None if absent."""
    matches = _ANSWER_RE.findall(text or "")
    return matches[-1].replace(",", "") if matches else None


def score(completion: str, answer: str | int) -> bool:
    """Whether the completion's extracted answer equals ``answer``: numerically (:func:`extract_answer`), or for a
    list answer (``"[...]"``, the ``lists`` task) as a list (:func:`prove.data.lists.score_list`)."""
    if str(answer).lstrip().startswith("["):
        return score_list(completion, str(answer))
    got = extract_answer(completion)
    if got is None:
        return False
    try:
        return float(got) == float(str(answer).replace(",", ""))
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m prove.data.synthetic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for train.jsonl and test.jsonl")
    parser.add_argument("--n", type=int, default=20000, help="training rows")
    parser.add_argument("--test-size", type=int, default=500, help="held-out prompts (distinct questions)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tasks", default="arithmetic", help=f"comma-separated generated tasks: {', '.join(TASKS)}"
    )
    parser.add_argument(
        "--instruct", action="store_true", help="phrase the questions for a pretrained chat model"
    )
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    train, tests = generate_tasks(tasks, args.n, args.test_size, args.seed, args.instruct)
    out = Path(args.out)
    write_jsonl(train, out / "train.jsonl")
    test = [as_prompt(r) for task in tasks for r in tests[task]]
    write_jsonl(test, out / "test.jsonl")
    if len(tasks) > 1:
        for task in tasks:
            write_jsonl((as_prompt(r) for r in tests[task]), out / f"test-{task}.jsonl")
    print(
        f"wrote {len(train)} training rows to {out / 'train.jsonl'} and {len(test)} prompts to {out / 'test.jsonl'}"
    )


if __name__ == "__main__":
    main()
