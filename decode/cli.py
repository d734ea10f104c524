"""``prove-decode``: decode a prompt file with one method (a thin Hydra shell over ``records.run``).

    prove-decode model=PATH method=prove verifier=PATH theta=0.1 block_size=16 \\
        prompts=prompts.jsonl output=out.jsonl max_new_tokens=256

Every key of ``prove.decode.config.DecodeConfig`` is overridable; ``method=NAME`` picks a method of
``prove.decode.methods``, whose registry entry holds its parameters' defaults. ``prove-decode --cfg job`` prints the composed config.
"""

from __future__ import annotations

from prove.common.errors import hydra_cli
from prove.decode.config import DecodeConfig, register_configs


def run(config: DecodeConfig) -> None:
    from prove.decode.records import run as decode_file

    print(decode_file(config))


def main() -> None:
    register_configs()
    hydra_cli("prove-decode", "prove.conf.decode", "decode", run)()


if __name__ == "__main__":
    main()
