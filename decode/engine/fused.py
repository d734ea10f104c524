"""Fused verify-and-draft: one pass of the model per cycle for block proposals it verifies itself
(``fuse=true``: ProVe-lossless, and NSD / ASD with ``proposer=block``; docs/design.md §3).

The unfused cycle spends two passes: a block pass ``[c, M_1..M_{K-1}]`` proposes y_1..y_K, a verification
pass over them gives the greedy tokens g_1..g_{k+1}. The fused cycle does both in the verification pass.

The tree. With the committed sequence of length L (positions 0..L-1, c = its last token, KV cached up to
the pending tokens), the pass feeds ``[pending, y_1..y_k, (branch), G_{j_1}, G_{j_2}, ...]``: one group
G_j = ``M × m_j`` (m_j ≤ K−1 placeholders) for each acceptance length j in the chosen set J ⊆ {0..k}.

- Positions (``position_ids``, not the layout, carry them): y_i sits at L+i−1 as in a plain pass; G_j's
  r-th placeholder (r = 0..m_j−1) at L+j+r, the positions of y_{j+1}..y_{j+m_j}.
- Attention (a float additive 4D mask: 0 = may attend, finfo.min = may not): every new entry sees the
  cached context and the pending tokens; pending and y rows are causal among themselves and never see a
  group; G_j's placeholder r sees y_1..y_j and G_j's placeholders 0..r, nothing else.

So G_j is, entry for entry, the block pass the proposer would run from the context ending at y_j
(``prove.decode.proposers.block``: ``[y_j, M_1..M_{K-1}]`` under a plain causal mask, M_r at the
position after y_j's plus r−1): its row r predicts the token at L+j+r+1. The row of y_j predicts g_{j+1}
(the block pass's position 1, exact); G_j's rows are that block pass's positions 2..K, i.e. proposals
for the m_j tokens after g_{j+1}, made with g_{j+1}'s position held by a placeholder, which is the
situation the proposer was trained for (the block's first slot is a placeholder too). When the rule
accepts n tokens and commits the correction / bonus g_{n+1} at position L+n, G_n's outputs are the next
cycle's proposal, whatever token was committed there (that position is masked), so the next cycle is
again a single pass. ``tests/decode/engine/test_fused.py`` checks this equivalence against separate block passes.

Layout and the KV cache (``tree.tree_layout``). The y's come first and all groups after them, so the entries
of the accepted y_1..y_n are contiguous right after the context and cropping stays contiguous;
``ModelRunner.forward_tree`` records group entries as ``SKIPPED`` in its ``fed`` list (never a committed token), so
the engine's per-cycle sync keeps exactly context + accepted y's, as AR would hold (the invariant of
``prove.decode.engine``).

Choosing J (``fuse_groups``). ``all``: every j with room left in the token budget, so every cycle after
the first carries a proposal (one pass per cycle; width ≈ k + (k+1)(K−1), 63 for K = 8). An integer m:
the m likeliest acceptance lengths under the proposer's own confidences p̃_i, read as independent
acceptances: P(n = j) = p̃_1 ⋯ p̃_j (1 − p̃_{j+1}) for j < k and p̃_1 ⋯ p̃_k for j = k. A narrower pass
costs less where the cost of a pass grows with its width (``prove-bench pass_cost_widths=80`` measures
t(w)/t(1)); a miss (n ∉ J) costs one cycle: see below. ``auto`` (the default): the device decides —
``choose_groups_by_cost`` keeps the likeliest length, then each other group whose expected gain pays for the
wider pass on a pass-cost curve measured when the Decoder is built (``pass_cost.measure_pass_cost``), each with as
many placeholders as pay for themselves: a group's row r is the next proposal's token r + 1, worth the running share
of carried proposals accepted that deep (``FusedBlockProposer.reach``; ``rows_that_pay``). Every group, whole,
where width is free; one to three on a CPU, cut where their rows stop paying (about four rows on SmolLM2-135M).

Carrying a proposal without breaking the one-loop engine. ``FusedBlockProposer`` and ``FusedVerifier``
share one state: the verifier's ``score`` runs the tree pass and hands the groups' logits to the proposer
(``receive``), keyed by the committed sequence and block they were computed from. The next ``propose``
reads the new committed sequence as that sequence + y_1..y_n + one token and takes G_n's proposal; when
n ∉ J it takes the rest of the nearest earlier group, G_j for the largest j ≤ n in J, from its row n − j
on: those rows predict the tokens after the committed one, from the context ending at y_j with the
positions of y_{j+1}..y_n and the correction held by placeholders (a block pass's deeper positions:
proposals the model was trained to make, only from further back). The carried proposal is a pure function
of the token prefix, so matching by content is all the bookkeeping there is (no engine hook, and the rule
stays the same pure function of the cycle's view). With nothing to carry (the first cycle, no group at or
before n, or a committed sequence that is not base + y_1..y_n + one token) the proposal is empty and the
pass is ``[pending, G_0]``: exactly the unfused block pass, whose first row (the next token, exact) the rule
commits as an AR step and whose placeholders' outputs become the next proposal. Two passes then commit
what the unfused block + verify passes commit, and every later cycle is one pass.

A second candidate (ProVe-lossless only: ``Method.branches``). A block proposal's tokens are drawn from one
pass of placeholders, so y_{i+1} does not depend on y_i: if y_{b+1} is wrong and the model's greedy token there
is z, the block [y_1..y_b, z, y_{b+2}..y_k] is as good a guess as the first one was. Where a carried proposal's
p̃ first drops under ``BRANCH_BELOW`` (position b, 0-based), the tree also holds that branch
[z, y_{b+2}..y_k] with z the proposer's second choice, at the positions of y_{b+1}..y_k and seeing y_1..y_b
(``tree.TreeLayout.branch``), and one more group after its end, seeing the whole branch (the branch's G_k).
The rule (``rules.block.greedy_match_branch``, pure) reads the branch's rows only when the block's leading run
stops at b with the greedy correction equal to z: then it commits z and the branch's matching run and the
branch's correction or bonus, so every committed token is still the greedy token after those before it. The
branch entries are never cached (like the groups): committed branch tokens are pending in the next pass. On
the demo, half of the rejected positions had the greedy token as the proposer's second choice; the branch
raised tokens per pass from 5.16 to 5.61 at J = 2 for ≤ 2K − 2 more entries.

Stats. ``model_passes`` counts the one pass per cycle; ``model_passes`` / ``new_tokens`` is the headline.
A cycle that proposed nothing (``proposed_by_depth[0]`` < ``cycles``) is a miss (or the first cycle).

What it buys. The carried proposal is the block pass's positions 2..K, so a fused cycle commits about one
token less than an unfused one (T − 1 against T tokens a cycle, y_1 being the exact token the unfused cycle
spends a pass to re-derive), in one pass instead of two: passes per token fall by 2(T − 1)/T (1.4× at
T = 3.5, 1.7× at T = 6). Whether that is wall-clock depends on how a pass's cost grows with its width: with
all groups a K = 8 pass is 64 tokens wide, with J = 1 or 2 it is 15 or 22. On the 2-core CPU of the tiny
demo a pass costs ~1.0 / 1.1 / 1.5× an 8-wide one at widths 15 / 22 / 64, so J = 1–2 is faster than
unfused there (about 1.3×) and J = all barely (1.07×); where a pass costs the same at any width (a large model on a
GPU) the pass count is the cost and J = all is the setting to use; ``auto`` finds which holds on the device
(on the demo's CPU it matched the best fixed J). Fusing is not the default (``fuse=false``):
unfused prove-lossless is the published method whose numbers users compare with, and the fused pass has
not yet been timed on a GPU; docs/benchmarks.md has the measured rows side by side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from prove.decode.config import parse_fuse_groups
from prove.decode.engine import ModelRunner
from prove.decode.engine.pass_cost import COST_CONTEXT, CostCurve, cost_widths, measure_pass_cost

# re-exported: the pass-cost curve moved to engine/pass_cost.py (the demo reads the widest tree here)
from prove.decode.engine.pass_cost import widest_tree as widest_tree
from prove.decode.engine.tree import tree_layout
from prove.decode.proposers.base import Proposal
from prove.decode.proposers.block import BlockProposer
from prove.decode.sampling import restrict

YIELD_WEIGHT = 0.1
"""``fuse_groups=auto``'s running tokens per pass: the newest cycle's weight (about the last ten cycles count)."""

BRANCH_BELOW = 0.9
"""A carried proposal's first position with p̃ under this gets a second candidate (``Proposal.branch``): on
the demo, half of the rejected positions had the greedy token as the proposer's second choice."""

# -- the choice of J -----------------------------------------------------------------------------------------


def acceptance_probs(conf: torch.Tensor | Sequence[float]) -> list[float]:
    """P(n = j), j = 0..k, for a proposal with confidences p̃ (k,) read as independent acceptances:
    p̃_1 ⋯ p̃_j (1 − p̃_{j+1}), and p̃_1 ⋯ p̃_k for j = k. Sums to 1. (Plain floats: k ≤ K is a handful,
    and this runs every cycle.)"""
    c = [min(max(float(x), 0.0), 1.0) for x in (conf.tolist() if isinstance(conf, torch.Tensor) else conf)]
    reach = 1.0  # P(n ≥ j)
    out = []
    for x in c:
        out.append(reach * (1 - x))
        reach *= x
    out.append(reach)
    return out


def choose_groups(conf: torch.Tensor, budget: int, width: int, limit: int | None) -> list[tuple[int, int]]:
    """J as [(j, m_j)] in increasing j, for a proposal with confidences ``conf`` (k,) in a cycle whose
    proposal budget is ``budget``.

    m_j = min(``width``, budget − j − 1): after accepting j tokens and the correction, the next cycle may
    propose budget − j − 1 tokens, so a longer group would be wasted work; j with m_j < 1 gets none.
    ``limit`` None keeps every such j; an integer m the m likeliest under ``acceptance_probs`` (ties: the
    shorter acceptance).
    """
    k = int(conf.shape[0])
    cand = [(j, min(width, budget - j - 1)) for j in range(k + 1)]
    cand = [(j, m) for j, m in cand if m >= 1]
    if limit is None or limit >= len(cand):
        return cand
    return sorted(_likeliest_first(cand, acceptance_probs(conf))[:limit])


def _likeliest_first(cand: list[tuple[int, int]], p: list[float]) -> list[tuple[int, int]]:
    """Groups by decreasing P(n = j); ties go to the shorter acceptance, whose group also serves the longer."""
    return sorted(cand, key=lambda jm: (-p[jm[0]], jm[0]))


# -- fuse_groups=auto: J by the device's pass-cost curve -------------------------------------------------------


def reach_sums(reach: Sequence[float], most: int) -> list[float]:
    """S(m) = R_1 + … + R_m for m = 0..``most``, with R made non-increasing (a proposal accepted to depth i was
    accepted to every depth before it; a noisy deeper estimate never counts for more) and missing depths 0."""
    r, s, sums = 1.0, 0.0, [0.0]
    for x in reach[:most]:
        r = min(r, max(float(x), 0.0))
        s += r
        sums.append(s)
    return sums + [s] * (most + 1 - len(sums))


def rows_that_pay(
    p: float,
    reach: Sequence[float] | list[float],
    *,
    tokens_per_pass: float,
    cost: CostCurve,
    width: int,
    most: int,
    covered: int = 0,
    sums: list[float] | None = None,
) -> tuple[int, float]:
    """How many placeholders a group should get, and what they are worth: (m, net) maximising
    net(m) = p · (S(m) − S(min(covered, m))) / T − (cost(width + m)/cost(width) − 1) over 1 ≤ m ≤ ``most``
    (a tie goes to more rows: where width is free a group is whole).

    A group's row r becomes token r + 1 of the next cycle's proposal, which commits only if the tokens before it
    do: it is worth ``reach``[r] = R_{r+1} tokens (the share of carried proposals whose first r + 1 tokens were
    accepted), times ``p``, the chance the group is the one carried; S = ``reach_sums`` (pass ``sums`` to reuse
    them), and T = ``tokens_per_pass`` turns tokens into a share of the pass's yield. ``covered`` rows would be
    carried anyway (by a kept group for a shorter acceptance), so only the rows past them count. The cost side is
    the share of a pass that m more entries add to a pass ``width`` wide. Deep rows are proposals that rarely
    survive: where width costs, they are cut before whole groups are."""
    if sums is None or len(sums) < most + 1:
        sums = reach_sums(reach, most)
    scale = p / max(tokens_per_pass, 1.0)
    a, b = cost.line  # cost(w) = max(floor, a + b·w), inlined: this runs for every group of every cycle
    floor = cost.seconds[0]
    base = max(floor, a + b * width)
    best_m, best = 1, -float("inf")
    for m in range(1, most + 1):
        net = scale * (sums[m] - sums[min(covered, m)]) - (max(floor, a + b * (width + m)) / base - 1.0)
        if net >= best:
            best_m, best = m, net
        elif m > covered:
            break  # past the covered rows each row is worth no more than the last, and costs no less
    return best_m, best


def choose_groups_by_cost(
    conf: torch.Tensor,
    budget: int,
    width: int,
    *,
    base: int,
    cost: CostCurve,
    tokens_per_pass: float,
    reach: Sequence[float] | None = None,
) -> list[tuple[int, int]]:
    """J for ``fuse_groups=auto``, as [(j, m_j)] in increasing j: the likeliest acceptance length always (a
    cycle without a carried proposal commits one token), then the others in order of ``acceptance_probs``,
    each kept while it pays for itself, each with as many placeholders as pay for themselves (``rows_that_pay``;
    at most ``width`` and what the budget leaves). Keeping G_j turns a miss at n = j into a carried proposal:
    its rows are worth P(n = j) · R_{r+1} / T of a pass's yield each (T = ``tokens_per_pass``, R = ``reach``,
    see ``rows_that_pay``), less the rows a kept G_i, i < j, would carry anyway (from its row j − i on); they
    cost cost(w + m)/cost(w) − 1 of the pass, w the width so far (``base`` = the pass's entries besides the
    groups). ``reach`` None: every R = (T − 1)/``width`` (a carried proposal worth T − 1 tokens, no depth
    preferred), so a group is kept whole or not at all. On a device where width is free this keeps every
    group, whole (``all``); where width costs, the one or two likeliest, cut where their rows stop paying."""
    cand = choose_groups(conf, budget, width, None)
    if not cand:
        return cand
    if reach is None:
        reach = [max(tokens_per_pass - 1.0, 0.0) / max(width, 1)] * width
    p = acceptance_probs(conf)
    order = _likeliest_first(cand, p)
    sums = reach_sums(reach, width)
    j, most = order[0]
    m, _ = rows_that_pay(
        p[j], reach, tokens_per_pass=tokens_per_pass, cost=cost, width=base, most=most, sums=sums
    )
    kept = [(j, m)]
    w = base + m
    t = max(tokens_per_pass, 1.0)
    for j, most in order[1:]:
        # a miss at n = j carries a kept G_i (i < j) from its row j − i on
        covered = max([mi - (j - i) for i, mi in kept if i < j] + [0])
        if p[j] * (sums[most] - sums[min(covered, most)]) / t < cost(w + 1) / cost(w) - 1.0:
            continue  # all its rows together are worth less than one row costs (most groups, on a CPU)
        m, net = rows_that_pay(
            p[j],
            reach,
            tokens_per_pass=tokens_per_pass,
            cost=cost,
            width=w,
            most=most,
            covered=covered,
            sums=sums,
        )
        if net >= 0:  # where width is free, a group whose rows another carries still costs nothing
            kept.append((j, m))
            w += m
    return sorted(kept)


# -- the proposer / verifier pair ---------------------------------------------------------------------------


@dataclass
class _Carry:
    base: list[int]
    """The committed sequence the tree pass ran on."""
    groups: list[tuple[list[int], torch.Tensor]]
    """Each group's context after ``base`` (y_1..y_j for G_j, the whole branch for the branch's group) and
    its logits (m, V): row r predicts the token r + 1 places after that context."""


class FusedBlockProposer(BlockProposer):
    """Block proposals that come out of the previous cycle's verification pass (see the module docstring).

    ``propose`` returns the carried proposal of the group whose context is the longest committed prefix
    (G_n when y_1..y_n and one token were committed), else an empty proposal; either way it plans the pass
    the paired ``FusedVerifier`` runs next: J (``plan``), the second candidate (``planned_branch``) and its
    group's size (``branch_plan``). ``groups`` = None for all acceptance lengths, m, or ``"auto"`` (by
    ``choose_groups_by_cost`` with the device's ``cost`` curve); ``branches``: propose second candidates (for a
    rule that reads them: ``Method.branches``).
    """

    def __init__(
        self,
        runner: ModelRunner,
        mask_token_id: int,
        block_size: int,
        *,
        groups: int | str | None = None,
        branches: bool = False,
        cost: CostCurve | None = None,
        **sampling: Any,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be ≥ 1")
        if (groups == "auto") != (cost is not None):
            raise ValueError(
                "fuse_groups=auto needs the device's pass-cost curve (cost=), and only it reads one"
            )
        super().__init__(runner, mask_token_id, block_size, **sampling)
        self.groups = groups
        self.branches = branches
        self.cost = cost
        self.tokens_per_pass = max(1.0, block_size / 2)
        """``auto``: a running mean (weight ``YIELD_WEIGHT`` on the newest cycle) of the tokens a cycle commits."""
        width = max(block_size - 1, 1)
        self.reach = [(self.tokens_per_pass - 1.0) / width] * width
        """``auto``: R_i, i = 1..K − 1, a running mean (weight ``YIELD_WEIGHT``) over the carried proposals of
        at least i tokens of whether their first i were accepted; it starts where ``choose_groups_by_cost``'s
        default does (a proposal worth T − 1 tokens, no depth preferred)."""
        self.proposed: list[int] = []
        """The last proposal's tokens (what ``reach`` is updated against)."""
        self.carry: _Carry | None = None
        self.plan: list[tuple[int, int]] = []
        self.planned_branch: tuple[int, int] | None = None
        self.branch_plan = 0
        """Placeholders in the group after the branch's end (0: none)."""

    def _committed_since_carry(self, seq: Sequence[int]) -> list[int] | None:
        """What was committed since the tree pass (y_1..y_n or a branch, and a correction); None when ``seq``
        does not extend that pass's sequence (nothing carried, or another request)."""
        c = self.carry
        if c is None or len(seq) <= len(c.base) or list(seq[: len(c.base)]) != c.base:
            return None
        return list(seq[len(c.base) :])

    def _carried(self, new: list[int]) -> torch.Tensor | None:
        assert self.carry is not None
        c = self.carry
        last = len(new) - 1
        # a group whose context is committed; its rows from last − len(context) on predict the tokens after
        # seq (the rows before them sit at committed positions); the longest context wins
        usable = [
            (path, g)
            for path, g in c.groups
            if len(path) <= last and new[: len(path)] == path and g.shape[0] > last - len(path)
        ]
        if not usable:
            return None
        path, g = max(usable, key=lambda pg: len(pg[0]))
        return g[last - len(path) :]

    def propose(self, seq: Sequence[int], budget: int) -> Proposal:
        new = self._committed_since_carry(seq)
        if new is not None and self.groups == "auto":
            self.tokens_per_pass += YIELD_WEIGHT * (len(new) - self.tokens_per_pass)
            n = next(
                (i for i, (a, b) in enumerate(zip(self.proposed, new, strict=False)) if a != b),
                len(self.proposed),
            )
            for i in range(min(len(self.proposed), len(self.reach))):
                self.reach[i] += YIELD_WEIGHT * (float(n > i) - self.reach[i])
        logits = self._carried(new) if new is not None else None
        self.carry = None
        if logits is None or budget < 1:
            proposal = Proposal.empty(self.runner.device)
        else:
            proposal = self.draw(logits[:budget])
            proposal = dataclasses.replace(proposal, branch=self._branch(proposal.conf, proposal.probs))
        self.proposed = proposal.tokens.tolist() if self.groups == "auto" else []
        self.planned_branch = proposal.branch
        # after the whole branch and its bonus the next cycle may propose budget − k − 1 tokens
        self.branch_plan = max(0, min(self.block_size - 1, budget - proposal.k - 1)) if proposal.branch else 0
        if self.groups == "auto":
            assert self.cost is not None
            b = proposal.branch[0] if proposal.branch is not None else proposal.k
            # the pass's entries besides the groups: pending (≈ 1), the y's, the branch and its group
            base = 1 + proposal.k + (proposal.k - b)
            if self.branch_plan:
                # the branch's group is carried at most when n = b (and the greedy token there is z): its rows
                # are priced as a group's at P(n = b), an upper bound
                p_b = acceptance_probs(proposal.conf)[b]
                m, net = rows_that_pay(
                    p_b,
                    self.reach,
                    tokens_per_pass=self.tokens_per_pass,
                    cost=self.cost,
                    width=base,
                    most=self.branch_plan,
                )
                self.branch_plan = m if net >= 0 else 0
            base += self.branch_plan
            self.plan = choose_groups_by_cost(
                proposal.conf,
                budget,
                self.block_size - 1,
                base=base,
                cost=self.cost,
                tokens_per_pass=self.tokens_per_pass,
                reach=self.reach,
            )
        else:
            limit = self.groups if isinstance(self.groups, int) else None
            self.plan = choose_groups(proposal.conf, budget, self.block_size - 1, limit)
        return proposal

    def _branch(self, conf: torch.Tensor, probs: torch.Tensor | None) -> tuple[int, int] | None:
        """(b, z): the first position whose p̃ is under ``BRANCH_BELOW`` and the proposer's second choice
        there (only where the rule reads branches); None if every p̃ clears it."""
        if not self.branches or probs is None:
            return None
        b = next((i for i, c in enumerate(conf.tolist()) if c < BRANCH_BELOW), None)
        if b is None:
            return None
        values, ids = probs[b].topk(2)
        if float(values[1]) <= 0:  # no second candidate (everything else is outside ``allowed``)
            return None
        return b, int(ids[1])

    def receive(self, seq: Sequence[int], groups: list[tuple[list[int], torch.Tensor]]) -> None:
        """The tree pass's groups for the committed ``seq``: (context after ``seq``, logits (m, V)) each."""
        self.carry = _Carry(list(seq), groups) if groups else None


class FusedVerifier:
    """The model scores the proposal and drafts the next one in one tree pass (``is_target``: its rows over
    y_1..y_k are the target logits the rule reads, exactly as ``ModelVerifier``'s). The tree is the one its
    proposer planned with the proposal: groups, and the second candidate if any."""

    is_target = True

    def __init__(self, runner: ModelRunner, proposer: FusedBlockProposer) -> None:
        self.runner = runner
        self.proposer = proposer

    def score(self, seq: Sequence[int], tokens: torch.Tensor) -> torch.Tensor:
        """Logits (k+1, V) over [pending, y_1..y_k]; with a second candidate (b, z), followed by the k − b rows
        of [z, y_{b+2}..y_k] (the rows ``rules.block.greedy_match_branch`` reads)."""
        k = int(tokens.shape[0])
        ys = tokens.tolist()
        prop = self.proposer
        b, z = prop.planned_branch if prop.planned_branch is not None else (None, None)
        layout = tree_layout(k, prop.plan, b, prop.branch_plan)
        path = None if b is None else [*ys[:b], z, *ys[b + 1 :]]
        chain = ys + ([] if path is None else path[b:])
        extra = chain + [prop.mask_token_id] * (layout.width - len(chain))
        logits = self.runner.forward_tree(seq, extra, offsets=layout.offsets, attend=layout.attend, chain=k)
        # row 0 is the last pending token; row 1 + e is tree entry e
        groups = [(ys[:j], logits[1 + start : 1 + start + m]) for j, start, m in layout.groups]
        if layout.branch_group is not None:
            assert path is not None
            start, m = layout.branch_group
            groups.append((path, logits[1 + start : 1 + start + m]))
        prop.receive(seq, groups)
        # the rows the rule reads: as ``ModelVerifier``'s, never an id outside ``Models.allowed``
        return restrict(logits[: len(chain) + 1], prop.allowed)  # (k+1 [+ k−b], V)


def build_fused(
    models, params, generator, *, branch: bool = False
) -> tuple[FusedBlockProposer, FusedVerifier]:
    """The pair for a Decoder with ``fuse=true`` (the method's proposer is ``block``, its verifier ``self``);
    ``branch``: propose a second candidate where p̃ is low (for a rule that reads it: ``Method.branches``)."""
    assert models.mask_token_id is not None, (
        "the Decoder checks the mask token before building a block proposer"
    )
    groups = parse_fuse_groups(params.fuse_groups)
    cost = None
    if groups == "auto":  # this device's pass-cost curve, once per Decoder (a few dozen passes)
        widths = cost_widths(params.block_size)
        context = [i % models.target.vocab_size for i in range(COST_CONTEXT)]
        cost = CostCurve(
            tuple(widths), tuple(measure_pass_cost(models.target.model, widths, context=context))
        )
    proposer = FusedBlockProposer(
        models.target,
        models.mask_token_id,
        params.block_size,
        groups=groups,
        cost=cost,
        allowed=models.allowed,
        branches=branch,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        generator=generator,
    )
    return proposer, FusedVerifier(models.target, proposer)
