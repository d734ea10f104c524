"""prove-eval's primary config (its own search path: the training groups `model`, `data`, ... would capture `model=PATH`)."""
