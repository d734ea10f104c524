"""``prove-eval``: decoding methods through lm-evaluation-harness. :mod:`.model` is the ``prove`` lm-eval
model and the method-vs-baseline comparison, :mod:`.cli` the front door (``EvalConfig``), :mod:`.tasks`
the task configs shipped with prove."""
