"""``backend=vllm``: our methods on vLLM (docs/vllm.md), as each method's registry entry says (``Method.vllm``).
:mod:`.backend` translates a method and its parameters into vLLM's engine arguments (``VllmDecoder``); :mod:`.stats`
reads vLLM's metrics back under our names; :mod:`.memory` sizes an engine before it starts; :mod:`.plugin` puts our
rules (prove, nsd, asd) into vLLM's step for the engines started with it (its vLLM subclasses in :mod:`.drafter`,
:mod:`.sampler`, :mod:`.scheduler`, :mod:`.worker`; the server's check in :mod:`.gate`); :mod:`.serve` is
``prove-serve``. Nothing here imports vLLM at import time: the four modules that subclass vLLM's pieces load in the
engine's process only."""
