"""``backend=vllm``: our methods on vLLM (docs/vllm.md). :mod:`.backend` translates a method and its parameters into
vLLM's engine arguments (``VllmDecoder``); :mod:`.stats` reads vLLM's metrics back under our names; :mod:`.memory`
sizes an engine before it starts; :mod:`.plugin` puts our rules (prove, nsd, asd) into vLLM's step for the engines
started with it; :mod:`.serve` is ``prove-serve``. Nothing here imports vLLM at import time."""
