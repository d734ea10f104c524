"""What training and decoding both need, in one package of its own: how the command-line entry points start and
report bad input (:mod:`prove.common.errors`), the structured-config helper both Hydra CLIs register their schema
with (:mod:`prove.common.schema`), and the checkpoint contract between a training stage and a decoder
(:mod:`prove.common.checkpoint`, ``prove.json``).

Dependency direction (docs/design.md §1): ``prove.data`` ← ``prove.common`` ← ``prove.train`` / ``prove.decode``.
This package imports ``prove.data`` (the loaders and the placeholder token) and nothing of ``train``, ``decode`` or
the recipes; it imports neither torch nor hydra at module level.
"""
