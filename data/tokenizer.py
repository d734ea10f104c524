"""Byte-level BPE tokenizers trained in-process: the tiny recipe's tokenizer and the tests' tokenizer.

The tokenizer speaks ChatML (``<|im_start|>role\\n...<|im_end|>``, as Qwen2.5 does) and carries the
MARS placeholder ``<|mask|>`` as a special token, so a checkpoint saved with it satisfies the
checkpoint contract of DESIGN §2.2 without a hub download.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerFast

MASK_TOKEN = "<|mask|>"
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's template without the tool-calling branches: a default system turn, ChatML turns, and the
# generation prompt on request.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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
