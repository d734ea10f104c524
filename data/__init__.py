"""prove.data — chat datasets (Dolci schema) and the tiny task.

- ``conversations``: :func:`~prove.data.conversations.load_chat_dataset` (hub id, JSONL / JSON / parquet, globs, folders, save_to_disk)
- ``chat``: :func:`~prove.data.chat.tokenize_conversation` (docs/design.md §2.1 ids / labels), row validation, ``SkipReport``
- ``build``: :func:`~prove.data.build.build_tokenized_dataset` (``datasets.map`` over a whole dataset)
- ``synthetic``: the arithmetic word-problem task of docs/design.md §5, task mixtures, the answer checker, the CLI
- ``lists``: the second generated task, short Python list-function requests with checkable list answers
- ``loading``: checkpoint / tokenizer loading and the contract checks training and decoding share
- ``gguf``: a GGUF model file converted once to a cached Hugging Face folder (any ``*.gguf`` path is a model source)
- ``tokenizer``: in-process ChatML byte-level BPE (``train_chatml_bpe``, ``build_tiny_tokenizer``)
- ``samples``: a small Dolci-schema sample for tests and demos
"""
