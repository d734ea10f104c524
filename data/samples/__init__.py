"""Small data files shipped with the package, for tests and demos.

``dolci_sample.jsonl``: 55 hand-written rows in Dolci's real schema (``id``, ``messages``, ``source``; every
message ``{role, content, function_calls, functions}``) — single- and multi-turn, with system turns,
``<think>`` reasoning, non-English text, and tool use as Dolci writes it (``functions`` = the JSON tool schemas on
a system or user turn, ``function_calls`` = JSON or Python-call text on the assistant turn, ``environment`` turns
= the tool output; a final turn with text + call, parallel calls, positional arguments) — and six rows the
data step skips, one per reason: a None content, an unknown role, a conversation ending on the user, an empty
reply, a call with a non-literal argument (``bad_function_calls``) and a schema that is not JSON (``bad_functions``).
"""

from pathlib import Path

DOLCI_SAMPLE = Path(__file__).with_name("dolci_sample.jsonl")
