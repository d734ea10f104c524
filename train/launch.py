"""What a multi-node launch needs besides the command line: the environment file of the DeepSpeed launcher.

With a hostfile, ``deepspeed`` starts the ranks of every node over ssh (pdsh). The remote shells do not
inherit the launching shell's environment: the launcher forwards only variables with a few prefixes
(``PYTHON*``, ``NCCL*``, ...) plus the ``KEY=value`` lines of ``$DS_ENV_FILE`` (default ``.deepspeed_env``)
found in the home directory and in the launch directory (the launch directory's wins). ``make train-proposer
HOSTFILE=...`` therefore writes the variables the ranks need into that file first::

    python -m prove.train.launch --env-file .deepspeed_env

Forwarded: the Hugging Face, tokenizers, wandb, OpenMP and PyTorch settings (:data:`FORWARD_PREFIXES`).
Never written: credentials (``*_TOKEN``, ``*_KEY``, ... see :data:`SECRET_MARKERS`) — the nodes read their own logins
(``huggingface-cli login``, ``wandb login`` in a shared home) — and ``CUDA_VISIBLE_DEVICES``, which the
launcher sets per node.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

FORWARD_PREFIXES = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "WANDB_",
    "OMP_",
    "MKL_",
    "PYTORCH_",
    "TORCH_",
    "CUDA_",
)
"""Variables with these prefixes are written to the environment file."""
SECRET_MARKERS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD"})
"""A name with one of these words (between underscores) is a credential, never written to a file:
``HF_TOKEN``, ``WANDB_API_KEY`` (not ``TOKENIZERS_PARALLELISM``)."""
NEVER = frozenset({"CUDA_VISIBLE_DEVICES"})
# The launcher double-quotes a value with other characters than these, so ", $, ` and \ would reach the
# remote shell unescaped; such values (and multi-line ones) are left out with a warning.
_SAFE_VALUE = re.compile(r'[^"$`\\\n\r]*')


def one_process_rendezvous(environ: dict[str, str] | None = None, port: int | None = None) -> dict[str, str]:
    """The rendezvous variables of a one-process run that no launcher started (``prove-train`` on one CPU or one
    GPU, as ``make train-proposer`` runs it there): rank 0 of 1 on 127.0.0.1, a free port unless ``MASTER_PORT`` is
    set. Without them ``deepspeed=...`` fails at start: DeepSpeed, finding no ``RANK``, asks MPI for one (``No module
    named 'mpi4py'``). A launch that set ``RANK`` or ``WORLD_SIZE`` (torchrun, the deepspeed launcher) is left alone.
    Sets them in ``environ`` (default ``os.environ``); returns the ones it set."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        return {}
    if port is None and "MASTER_PORT" not in env:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
    added = {k: v for k, v in wanted.items() if k not in env}
    env.update(added)
    return added


def forwarded_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(variables to write, names left out with the reason)`` from ``environ``."""
    keep: dict[str, str] = {}
    skipped: list[str] = []
    for name in sorted(environ):
        if not name.startswith(FORWARD_PREFIXES) or name in NEVER:
            continue
        if SECRET_MARKERS & set(name.upper().split("_")):
            skipped.append(f"{name} (a credential: log in on each node instead)")
            continue
        value = environ[name]
        if not _SAFE_VALUE.fullmatch(value):
            skipped.append(f"{name} (its value has a quote, $, backquote, backslash or newline)")
            continue
        keep[name] = value
    return keep, skipped


def write_env_file(path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write the forwarded variables of ``environ`` (default: this process's) as ``KEY=value`` lines.

    The file holds nothing else: DeepSpeed splits every line at its first ``=``, so a comment or a blank line
    would break the launch. Returns what was written.
    """
    keep, skipped = forwarded_env(os.environ if environ is None else environ)
    for why in skipped:
        print(f"prove.train.launch: not forwarding {why}", file=sys.stderr)
    text = "".join(f"{k}={v}\n" for k, v in keep.items())
    Path(path).write_text(text)
    return keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prove.train.launch", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env-file",
        default=os.environ.get("DS_ENV_FILE", ".deepspeed_env"),
        help="the file DeepSpeed's launcher reads (default: $DS_ENV_FILE or .deepspeed_env)",
    )
    args = parser.parse_args(argv)
    written = write_env_file(args.env_file)
    print(
        f"prove.train.launch: {len(written)} variables -> {args.env_file}: {' '.join(written)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
