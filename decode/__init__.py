"""prove.decode — one cycle engine, proposers, verifiers, pure acceptance rules, CLI and bench."""
