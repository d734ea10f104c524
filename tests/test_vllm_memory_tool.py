"""tools/vllm_memory.py: the resident memory it reads covers vLLM's child processes, and a bad call is refused."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.tools_helpers import load_tool


def test_the_reading_counts_child_processes():
    tool = load_tool("vllm_memory")
    before = tool.tree_rss_gib()
    # a child holding 256 MiB of touched memory, as vLLM's engine-core and worker processes hold the weights
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = bytearray(256 * 2**20); time.sleep(30)"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.5)
        assert tool.tree_rss_gib() - before > 0.2
    finally:
        child.kill()
        child.wait()


def test_prove_without_a_verifier_is_refused():
    with pytest.raises(SystemExit, match="needs --verifier"):
        load_tool("vllm_memory").main(["--model", "x", "--methods", "prove"])
