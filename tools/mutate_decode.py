"""A scripted mutation pass over the decode rules, engine and methods: apply each textual mutant alone, run
the decode tests that concern it (stopping at the first failure), report which mutants survived.

    .venv/bin/python tools/mutate_decode.py            # every mutant
    .venv/bin/python tools/mutate_decode.py asd-gate   # the named ones

A mutant "survives" when its tests all pass. The tree is restored after each mutant (and on Ctrl-C).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ["tests/decode/test_rules_speculative.py", "tests/decode/test_rules_block.py"]
HARD = ["tests/decode/test_sampling.py", "tests/decode/test_decoder.py", "tests/decode/test_validation.py"]
MC = ["tests/decode/test_engine_montecarlo.py"]
ENGINE = ["tests/decode/engine/test_engine.py", "tests/decode/test_draft.py"]
FUSED = ["tests/decode/engine/test_fused.py"]
PAD = ["tests/decode/engine/test_padding.py"]

# (name, file, original text, mutated text, test files): one mutant a line, so the table reads as one
# fmt: off
MUTANTS = [
    ("asd-gate-K-i", "decode/rules/speculative.py", "gate * (K - i + 1)", "gate * (K - i)", RULES),
    ("asd-budget-ignores-spent", "decode/rules/speculative.py", "spent + r <= budget", "r <= budget", RULES),
    ("asd-m-off-by-one", "decode/rules/speculative.py", "used < max_mismatches", "used <= max_mismatches", RULES),
    ("sd-accept-swapped", "decode/rules/speculative.py", "ok = uniforms[..., :k] * q_y < p_y", "ok = uniforms[..., :k] * p_y < q_y", RULES),
    ("sd-no-residual", "decode/rules/speculative.py", "residual = (p_row - q_row).clamp_min(0)", "residual = p_row", RULES),
    ("nucleus-le", "decode/rules/speculative.py", "keep_sorted = (mass_before < theta)", "keep_sorted = (mass_before <= theta)", RULES),
    ("warp-no-temperature", "decode/rules/speculative.py", "    logits = logits / temperature\n", "    logits = logits\n", RULES + MC),
    ("warp-no-top-k", "decode/rules/speculative.py", "if 0 < top_k < logits.shape[-1]:", "if False:", RULES + MC),
    ("prove-y1-not-always", "decode/rules/block.py", "return Accept(max(1, _leading_run(score >= theta)))", "return Accept(_leading_run(score >= theta))", RULES + HARD),
    ("mars-strict", "decode/rules/block.py", "proposer_conf[1:] >= tau", "proposer_conf[1:] > tau", RULES + ENGINE),
    ("greedy-bonus-row", "decode/rules/block.py", "return Accept(n, greedy[n])", "return Accept(n, greedy[k])", RULES + ENGINE),
    ("prove-q-next-row", "decode/methods.py", "q = token_prob(view.verifier_logits, view.proposal.tokens)", "q = token_prob(view.verifier_logits[1:], view.proposal.tokens)", HARD + ENGINE),
    ("prove-q-dropped", "decode/methods.py", "return prove_rule(view.proposal.conf, q, view.params.theta)", "return prove_rule(view.proposal.conf, torch.ones_like(q), view.params.theta)", HARD + ENGINE),
    ("sd-target-unwarped", "decode/methods.py", "target = logits_to_probs(view.target_logits, p.temperature, p.top_k, p.top_p)", "target = logits_to_probs(view.target_logits, 1.0)", MC),
    ("sd-target-no-top-p", "decode/methods.py", "target = logits_to_probs(view.target_logits, p.temperature, p.top_k, p.top_p)", "target = logits_to_probs(view.target_logits, p.temperature, p.top_k, 1.0)", MC),
    ("ar-no-temperature", "decode/methods.py", "probs = logits_to_probs(view.target_logits[0], p.temperature, p.top_k, p.top_p)", "probs = logits_to_probs(view.target_logits[0], 1.0, p.top_k, p.top_p)", MC),
    ("ar-no-top-k", "decode/methods.py", "probs = logits_to_probs(view.target_logits[0], p.temperature, p.top_k, p.top_p)", "probs = logits_to_probs(view.target_logits[0], p.temperature, 0, p.top_p)", MC),
    ("nsd-check-dropped", "decode/methods.py", "        check=_check_nsd,\n", "", HARD),
    ("asd-K-unset", "decode/methods.py", "block_size=view.proposal.k,", "block_size=None,", ENGINE),
    ("draft-probs-unwarped", "decode/proposers/draft.py", "rows.append(probs)", "rows.append(logits.float().softmax(-1))", MC),
    ("engine-accepted-uncut", "decode/engine/loop.py", "min(step.accepted, len(committed))", "step.accepted", HARD),
    ("engine-budget-no-extra", "decode/engine/loop.py", "left - int(self.adds_token)", "left", HARD + ENGINE),
    ("engine-no-sync", "decode/engine/loop.py", "            runner.sync(seq)\n", "            pass\n", ENGINE),
    ("stopper-max-off-by-one", "decode/engine/loop.py", "len(new) >= self.max_new_tokens", "len(new) > self.max_new_tokens", HARD + ENGINE),
    ("engine-keep-all-valid", "decode/engine/runner.py", "keep = min(self._valid_prefix(seq), len(seq) - 1)", "keep = min(self._valid_prefix(seq), len(seq))", ENGINE),
    ("restrict-off", "decode/sampling.py", "    if allowed is None:\n        return logits\n", "    return logits\n", HARD),
    ("fused-carry-row-off-by-one", "decode/engine/fused.py", "return g[last - len(path) :]", "return g[last - len(path) + 1 :]", FUSED),
    ("fused-carry-farthest-group", "decode/engine/fused.py", "path, g = max(usable, key=lambda pg: len(pg[0]))", "path, g = min(usable, key=lambda pg: len(pg[0]))", FUSED),
    ("fused-verifier-unrestricted", "decode/engine/fused.py", "return restrict(logits[: len(chain) + 1], prop.allowed)", "return logits[: len(chain) + 1]", FUSED),
    ("fused-proposer-unrestricted", "decode/proposers/block.py", "probs = logits_to_probs(restrict(logits, self.allowed),", "probs = logits_to_probs(logits,", FUSED + ENGINE),
    ("fused-group-sees-one-y-less", "decode/engine/tree.py", "attend[rows, :j] = True", "attend[rows, : max(j - 1, 0)] = True", FUSED),
    ("fused-group-offset-shifted", "decode/engine/tree.py", "offsets[rows] = np.arange(j, j + m)", "offsets[rows] = np.arange(j + 1, j + m + 1)", FUSED),
    ("fused-tree-rows-blind-to-pending", "decode/engine/runner.py", "local[pending:, pending:] = attend\n", "local[pending:, :] = torch.cat([torch.zeros(q - pending, pending, dtype=torch.bool), attend], 1)\n", FUSED),
    ("fused-likeliest-ties-longer", "decode/engine/fused.py", "key=lambda jm: (-p[jm[0]], jm[0])", "key=lambda jm: (-p[jm[0]], -jm[0])", FUSED),
    ("branch-compares-shifted", "decode/rules/block.py", "m = _matching_prefix(rest, greedy)", "m = _matching_prefix(rest, greedy[1:])", RULES + FUSED),
    ("branch-bonus-last-row", "decode/rules/block.py", "return Accept(b + 1 + m, greedy[m], path=path)", "return Accept(b + 1 + m, greedy[-1], path=path)", RULES + FUSED),
    ("branch-z-unchecked", "decode/rules/block.py", "if main.n != b or main.extra != z:", "if main.n != b:", RULES + FUSED),
    ("branch-group-misses-last", "decode/engine/tree.py", "attend[rows, k : k + nb] = True  # the whole branch", "attend[rows, k : k + nb - 1] = True", FUSED),
    ("branch-group-never-carried", "decode/engine/fused.py", "groups.append((path, logits[1 + start : 1 + start + m]))", "groups.append((path, logits[1 + start : 1 + start]))", FUSED),
    ("branch-everywhere", "decode/engine/fused.py", "if c < BRANCH_BELOW), None)", "if c < 2.0), None)", FUSED),
    ("tree-memo-ignores-pending", "decode/engine/runner.py", "(offsets, attend), (pending, device), build)", "(offsets, attend), (device,), build)", FUSED),
    ("memo-ignores-objects", "decode/engine/memo.py", "key = (*map(id, objects), *extra)", "key = extra", HARD + FUSED),
    ("auto-ignores-cost", "decode/engine/fused.py", "- (max(floor, a + b * (width + m)) / base - 1.0)", "- 0.0", FUSED),
    ("auto-no-discount", "decode/engine/fused.py", "covered = max([mi - (j - i) for i, mi in kept if i < j] + [0])", "covered = 0", FUSED),
    ("auto-reach-frozen", "decode/engine/fused.py", "self.reach[i] += YIELD_WEIGHT * (float(n > i) - self.reach[i])", "self.reach[i] += 0.0", FUSED),
    ("auto-reach-off-by-one", "decode/engine/fused.py", "self.reach[i] += YIELD_WEIGHT * (float(n > i) - self.reach[i])", "self.reach[i] += YIELD_WEIGHT * (float(n >= i) - self.reach[i])", FUSED),
    ("auto-reach-not-monotone", "decode/engine/fused.py", "r = min(r, max(float(x), 0.0))", "r = max(float(x), 0.0)", FUSED),
    ("auto-branch-group-whole", "decode/engine/fused.py", "self.branch_plan = m if net >= 0 else 0", "pass", FUSED),
    ("auto-yield-frozen", "decode/engine/fused.py", "self.tokens_per_pass += YIELD_WEIGHT * (len(new) - self.tokens_per_pass)", "self.tokens_per_pass += 0.0", FUSED),
    ("pad-filler-rows-returned", "decode/engine/runner.py", "return out.logits[0, -(rows + pad) : out.logits.shape[1] - pad]", "return out.logits[0, -rows:]", PAD),
    ("pad-filler-kept-in-cache", "decode/engine/runner.py", "        self.fed.extend(fed)\n", "        self.fed.extend(fed + tokens[len(tokens) - pad :])\n", PAD),
    ("pad-tree-passes-too", "decode/engine/runner.py", "len(tokens) if tree is None else 0", "len(tokens)", PAD),
    ("pad-plan-no-margin", "decode/engine/padding.py", "best_t <= (1 - margin) * t", "best_t < t", PAD),
    ("pad-calibration-reuses-row", "decode/engine/pass_cost.py", "        runner._rows = None  # every timed pass feeds its full width (no reused row)\n", "", PAD),
    ("auto-line-fits-ar-step", "decode/engine/pass_cost.py", "zip(self.widths, self.seconds, strict=True) if w >= 2]", "zip(self.widths, self.seconds, strict=True) if w >= 1]", FUSED),
]
# fmt: on


def run(name: str, path: str, old: str, new: str, tests: list[str]) -> tuple[str, float]:
    file = ROOT / path
    text = file.read_text()
    if text.count(old) != 1:
        return "NOT APPLIED (text not found once)", 0.0
    file.write_text(text.replace(old, new))
    t0 = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        file.write_text(text)
    return ("killed" if proc.returncode != 0 else "SURVIVED"), time.time() - t0


def main() -> None:
    by_name = {m[0]: m for m in MUTANTS}
    unknown = [n for n in sys.argv[1:] if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown mutant(s) {unknown}; known: {list(by_name)}")
    for name in sys.argv[1:] or list(by_name):  # in the order given
        _, path, old, new, tests = by_name[name]
        verdict, secs = run(name, path, old, new, tests)
        print(f"{name:28s} {verdict:10s} {secs:6.1f}s  ({path})", flush=True)


if __name__ == "__main__":
    main()
