"""Byte-level BPE tokenizers trained in-process: the tiny recipe's tokenizer and the tests' tokenizer.

The tokenizer speaks ChatML (``<|im_start|>role\\n...<|im_end|>``, as Qwen2.5 does) and carries the
MARS placeholder ``<|mask|>`` as a special token, so a checkpoint saved with it satisfies the
checkpoint contract of docs/design.md §2.2 without a hub download.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prove.data.loading import MASK_TOKEN
from transformers import PreTrainedTokenizerFast

# The split pattern of Qwen2 / Qwen2.5 tokenizers (a fact of their format, needed for compatibility).
QWEN2_SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's chat format, written out for tokenizers built here: ChatML turns, an optional default system turn,
# and Qwen2.5's tool calling — the schemas (`tools=`) listed in the system turn, an assistant's `tool_calls`
# as <tool_call> JSON lines after its text, and consecutive `tool` turns as <tool_response> blocks inside one
# user turn. The fixed instruction text around the schemas is Qwen2.5's own (a fact of its format: a model
# fine-tuned on it must see the same text it sees at inference).
_TOOLS_INSTRUCTIONS = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_CALL_FORMAT = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call>"
)


def _chatml_template(default_system: str | None) -> str:
    first_is_system = "messages and messages[0]['role'] == 'system'"
    head_default = "" if default_system is None else f"{{{{- '{default_system}\\n\\n' }}}}"
    plain_default = (
        ""
        if default_system is None
        else f"{{%- else %}}{{{{- '<|im_start|>system\\n{default_system}<|im_end|>\\n' }}}}"
    )
    return (
        # the system turn: the given or default system text, then the tool schemas when tools are given
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        f"{{%- if {first_is_system} %}}{{{{- messages[0]['content'] + '\\n\\n' }}}}"
        + (f"{{%- else %}}{head_default}" if default_system is not None else "")
        + "{%- endif %}"
        f"{{{{- '{_TOOLS_INSTRUCTIONS}' }}}}"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
        f"{{{{- '{_TOOLS_CALL_FORMAT}<|im_end|>\\n' }}}}"
        f"{{%- elif {first_is_system} %}}{{{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}}}"
        f"{plain_default}"
        "{%- endif %}"
        # the turns
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' and loop.first %}"
        "{%- elif message['role'] == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
        "{{- '<|im_start|>assistant' }}"
        "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
        "{%- for call in message['tool_calls'] %}"
        "{%- set fn = call['function'] if call['function'] is defined else call %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + (fn['arguments'] | tojson) + '}"
        "\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


CHATML_TEMPLATE = _chatml_template("You are a helpful assistant.")
# The same without the default system turn: the tiny recipe's template (11 fewer tokens per example).
CHATML_TEMPLATE_NO_SYSTEM = _chatml_template(None)


def train_chatml_bpe(
    texts: Iterable[str],
    vocab_size: int = 512,
    *,
    with_mask: bool = True,
    min_frequency: int = 2,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a ChatML chat tokenizer.

    ``with_mask=False`` builds a stock tokenizer without ``<|mask|>`` (what a checkpoint that was never
    block-trained looks like); MARS training adds the token itself.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Qwen2's normalizer and pre-tokenizer (digits split one by one): transformers 5.x reloads a
    # checkpoint's tokenizer through the model type's class (Qwen2Tokenizer), which rebuilds the
    # pipeline from vocab + merges; training with the same pipeline keeps save -> reload identical.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = CHATML_SPECIALS + ([MASK_TOKEN] if with_mask else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Templates put roles and content right after <|im_start|>/newline: exercise those merges too.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"] + ([MASK_TOKEN] if with_mask else []),
        chat_template=CHATML_TEMPLATE,
    )
    fast.model_max_length = 4096
    return fast


def render_chatml(
    messages: list[dict[str, str]], *, add_generation_prompt: bool = False, default_system: bool = True
) -> str:
    """What ``CHATML_TEMPLATE`` (``default_system=False``: ``CHATML_TEMPLATE_NO_SYSTEM``) renders, in plain
    Python — for training a tokenizer before one exists."""
    parts = []
    if default_system and (not messages or messages[0]["role"] != "system"):
        parts.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def build_tiny_tokenizer(
    rows: Iterable[dict],
    vocab_size: int = 512,
    *,
    with_mask: bool = True,
    default_system: bool = False,
) -> PreTrainedTokenizerFast:
    """The tiny recipe's tokenizer (docs/design.md §5): byte-level BPE trained on the rows' ChatML renders.

    ``rows`` carry a ``messages`` list (e.g. :func:`prove.data.synthetic.generate_arithmetic`). The BPE
    sees each rendered conversation with the special tokens cut out, so it learns the role headers as
    well as the task text. The chat template is ChatML; by default without Qwen's default system turn
    ("You are a helpful assistant.", 11 tokens a conversation that a 1M-parameter model has no use for).
    On the arithmetic task the default 512-token vocabulary gives ~93 tokens per tokenized training
    example (docs/design.md §5; tests/data/test_tokenizer.py checks the range).
    """
    splitter = re.compile("|".join(re.escape(s) for s in CHATML_SPECIALS + [MASK_TOKEN]))

    def pieces():
        for row in rows:
            messages = row["messages"]
            if not all(
                isinstance(m.get("content"), str) and isinstance(m.get("role"), str) for m in messages
            ):
                continue  # a malformed row: the data step skips it too
            for piece in splitter.split(render_chatml(messages, default_system=default_system)):
                if piece:
                    yield piece

    tok = train_chatml_bpe(pieces(), vocab_size, with_mask=with_mask)
    tok.chat_template = CHATML_TEMPLATE if default_system else CHATML_TEMPLATE_NO_SYSTEM
    return tok
