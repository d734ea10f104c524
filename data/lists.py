"""A second generated task: short Python list-manipulation requests with checkable answers.

    user:      Write a short Python function that reverses a list. Then show what it returns for [3, 8, 1, 6].
    assistant: ```python
               def reverse_list(xs):
                   return xs[::-1]
               ```
               reverse_list([3, 8, 1, 6]) returns [6, 1, 8, 3]. The answer is [6, 1, 8, 3].

Twelve operations (sorting, reversing, filtering, mapping, slicing, running totals) on lists of 3–6 numbers from
0–20, in three phrasings. Every answer is a list that differs from the input, so a response that only echoes
the input is never credited (:func:`extract_list` takes the last list a response writes). Rows follow the
Dolci schema (``messages``) plus ``answer`` (the list as Python writes it) and ``id``, like
:func:`prove.data.synthetic.generate_arithmetic`, so the same CLI, splits and scoring serve both; everything is
a deterministic function of the seed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Operation:
    """One list operation: how a request names it, the function a reply writes, and what it computes."""

    does: str
    """What the function does, as a request says it ("reverses a list"); ``{k}`` is the operation's parameter."""
    name: str
    """The function's name."""
    body: str
    """The function's body (4-space indented lines); ``{k}`` is the parameter."""
    apply: Callable[[list[int], int], list[int]]
    """The answer for ``(xs, k)``."""
    k_range: tuple[int, int] = (0, 0)
    """The parameter's range (inclusive); ``(0, 0)``: the operation has none."""


def _running(xs: list[int], _: int) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


OPERATIONS = [
    Operation("sorts a list of numbers from smallest to largest", "sort_ascending",
              "    return sorted(xs)", lambda xs, k: sorted(xs)),
    Operation("sorts a list of numbers from largest to smallest", "sort_descending",
              "    return sorted(xs, reverse=True)", lambda xs, k: sorted(xs, reverse=True)),
    Operation("reverses a list", "reverse_list", "    return xs[::-1]", lambda xs, k: xs[::-1]),
    Operation("removes duplicate numbers from a list, keeping the first of each", "remove_duplicates",
              "    return list(dict.fromkeys(xs))", lambda xs, k: list(dict.fromkeys(xs))),
    Operation("keeps only the even numbers of a list", "keep_even",
              "    return [x for x in xs if x % 2 == 0]", lambda xs, k: [x for x in xs if x % 2 == 0]),
    Operation("keeps only the odd numbers of a list", "keep_odd",
              "    return [x for x in xs if x % 2 == 1]", lambda xs, k: [x for x in xs if x % 2 == 1]),
    Operation("doubles every number in a list", "double_all",
              "    return [2 * x for x in xs]", lambda xs, k: [2 * x for x in xs]),
    Operation("squares every number in a list", "square_all",
              "    return [x * x for x in xs]", lambda xs, k: [x * x for x in xs]),
    Operation("adds {k} to every number in a list", "add_{k}",
              "    return [x + {k} for x in xs]", lambda xs, k: [x + k for x in xs], (1, 9)),
    Operation("returns the first {k} numbers of a list", "first_{k}",
              "    return xs[:{k}]", lambda xs, k: xs[:k], (1, 3)),
    Operation("removes every {k} from a list", "remove_{k}",
              "    return [x for x in xs if x != {k}]", lambda xs, k: [x for x in xs if x != k], (0, 20)),
    Operation("returns the running totals of a list", "running_totals",
              "    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
              _running),
]  # fmt: skip
REQUESTS = [
    "Write a short Python function that {does}. Then show what it returns for {xs}.",
    "Write a Python function `{name}(xs)` that {does}, and give {name}({xs}).",
    "In Python, write a function that {does}. What does it return for {xs}?",
]
MAX_VALUE = 20
_LIST_RE = re.compile(r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*,?\s*\]")
_ANSWER_LIST_RE = re.compile(r"answer is:?\s*(\[[^\]]*\])", re.IGNORECASE)


def _input_list(rng: random.Random, op: Operation, k: int) -> list[int]:
    """A 3–6 number list on which ``op`` gives a non-empty answer different from the input."""
    while True:
        xs = [rng.randint(0, MAX_VALUE) for _ in range(rng.randint(3, 6))]
        if op.name == "remove_duplicates":  # make sure there is something to remove
            xs.insert(rng.randint(0, len(xs)), rng.choice(xs))
        if op.name.startswith("remove_") and op.k_range != (0, 0):
            xs.insert(rng.randint(0, len(xs)), k)
        answer = op.apply(xs, k)
        if answer and answer != xs:
            return xs


def make_list_problem(rng: random.Random) -> tuple[str, str, list[int]]:
    """One request: ``(question, reply, answer)``."""
    op = rng.choice(OPERATIONS)
    k = rng.randint(*op.k_range)
    xs = _input_list(rng, op, k)
    does, name = op.does.format(k=k), op.name.format(k=k)
    answer = op.apply(xs, k)
    question = rng.choice(REQUESTS).format(does=does, name=name, xs=xs)
    code = f"def {name}(xs):\n{op.body.format(k=k)}"
    reply = f"```python\n{code}\n```\n{name}({xs}) returns {answer}. The answer is {answer}."
    return question, reply, answer


def generate_lists(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows with distinct questions, deterministic in ``seed``: ``{"id", "messages": [user, assistant],
    "answer": "[...]"}``."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < n:
        question, reply, answer = make_list_problem(rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "id": f"lists-{seed}-{len(rows):06d}",
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": reply},
                ],
                "answer": str(answer),
            }
        )
    return rows


def extract_list(text: str) -> list[int] | None:
    """The list after the last "The answer is", else the last list of integers the text writes; None if none."""
    said = _ANSWER_LIST_RE.findall(text or "")
    candidates = said[-1:] if said else [m.group(0) for m in _LIST_RE.finditer(text or "")][-1:]
    for literal in candidates:
        inner = literal.strip()[1:-1].strip().rstrip(",")
        try:
            return [int(x) for x in inner.split(",")] if inner else []
        except ValueError:
            return None
    return None


def score_list(completion: str, answer: str) -> bool:
    """Whether the completion's list (:func:`extract_list`) equals ``answer`` (a list as Python writes it)."""
    got = extract_list(completion)
    return got is not None and got == extract_list(answer)
