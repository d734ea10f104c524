"""HumanEval offline: the prompt file and the pass@1 scorer (problems written here, no package needed)."""

from __future__ import annotations

import gzip
import json

import pytest
from prove.data import humaneval

PROBLEM = {
    "task_id": "T/0",
    "prompt": 'def add(a, b):\n    """a + b"""\n',
    "test": "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n",
    "entry_point": "add",
}


@pytest.fixture
def prompt_file(tmp_path):
    src = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write(json.dumps(PROBLEM) + "\n" + json.dumps({**PROBLEM, "task_id": "T/1"}) + "\n")
    humaneval.main(["prompts", "--source", str(src), "--out", str(tmp_path / "he.jsonl"), "--limit", "1"])
    return tmp_path / "he.jsonl"


def outputs(tmp_path, completions):
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps({"id": "T/0", "completion": c}) + "\n" for c in completions))
    return out


def test_prompt_file_is_raw_stubs_with_what_scoring_needs(prompt_file):
    rows = [json.loads(line) for line in prompt_file.read_text().splitlines()]
    assert rows == [
        {
            "id": "T/0",
            "prompt": PROBLEM["prompt"],
            "stub": PROBLEM["prompt"],
            "test": PROBLEM["test"],
            "entry_point": "add",
        }
    ]  # --limit 1 kept the first


def test_score_runs_the_tests_on_the_truncated_body(prompt_file, tmp_path):
    completions = [
        "    return a + b\n",  # right
        "    return a - b\n",  # wrong
        "    return a + b\n\ndef broken(:\n",  # right, then a syntax error past the body: truncation must cut it
        "    return a + b\n# trailing\nraise SystemExit(1)\n",  # a comment at column 0 ends the body too
        "    while True:\n        pass\n",  # never returns: the time limit fails it
    ]
    got = [ok for _, ok in humaneval.score(prompt_file, outputs(tmp_path, completions), timeout=2.0)]
    assert got == [True, False, True, True, False]


def test_truncate_cuts_at_the_first_stop_only():
    assert (
        humaneval.truncate("    x = 1\n    # note\n    return x\nprint(x)\n")
        == "    x = 1\n    # note\n    return x"
    )


def test_scoring_asks_before_running_code_and_names_a_foreign_id(prompt_file, tmp_path):
    out = outputs(tmp_path, ["    return a + b\n"])
    with pytest.raises(SystemExit, match="--confirm-run-unsafe-code"):
        humaneval.main(["score", "--prompts", str(prompt_file), "--outputs", str(out)])
    out.write_text(json.dumps({"id": "X/9", "completion": ""}) + "\n")
    with pytest.raises(SystemExit, match="X/9"):
        list(humaneval.score(prompt_file, out))


def test_chat_form_asks_for_the_function_and_scores_the_reply_s_code_block(tmp_path):
    out = humaneval.write_prompts([PROBLEM], tmp_path / "chat.jsonl", chat=True)
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert "prompt" not in row and row["stub"] == PROBLEM["prompt"]
    (turn,) = row["messages"]
    assert turn["role"] == "user" and f"```python\n{PROBLEM['prompt']}```" in turn["content"]
    replies = [
        "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds them.",  # right
        "```python\ndef add(a, b):\n    return a * b\n```",  # wrong
        "```py\ndef add(a, b):\n    return sum([a, b])\n",  # right, the fence never closed (cut by the limit)
        "```\n\nThis function adds a and b.",  # an empty block: the stub alone returns None
    ]
    got = [ok for _, ok in humaneval.score(out, outputs(tmp_path, replies), timeout=5.0)]
    assert got == [True, False, True, False]
