"""prove-decode and prove-bench configs: decode.yaml and bench.yaml select their schemas (prove.decode.config,
prove.decode.bench.config) and set Hydra up."""
