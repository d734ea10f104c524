"""The method registry (docs/design.md §3): a method = (proposer, verifier, rule adapter, default params).

Composing differently is one new entry, not a new code path: e.g. NSD's nucleus rule on the block
proposer self-verified is ``Method("block-nsd", proposer="block", verifier="self", accept=...)``.
``accept`` receives a ``CycleView`` (proposal, target / verifier logits, params, generator, per-request
state) and calls a pure rule from ``prove.decode.rules``.

| method           | proposer | verifier | rule                                                    |
|------------------|----------|----------|---------------------------------------------------------|
| `ar`             | none     | self     | the target's next token (greedy, or sampled)            |
| `mars`           | block    | none     | y_1, then y_i while p̃_i ≥ τ (τ = 0.95, MARS)            |
| `prove`          | block    | small    | longest leading run with p̃_i·q_i ≥ θ, y_1 always (θ = 0.1) |
| `prove-lossless` | block    | self     | greedy match + correction / bonus (exactly AR greedy); `fuse=true`: one pass a cycle |
| `sd`             | draft    | self     | greedy match (greedy); min(1, p/q) + residual + bonus (sampling) |
| `nsd`            | draft    | self     | SD, or y_i in the target's top-θ nucleus (θ = 0.9); same residual |
| `asd`            | draft    | self     | greedy; mismatches within gate g, m per block, budget B per request |
| `pard`           | draft-block | self  | greedy match + correction / bonus: a small MARS model drafts K in one pass (PARD) |

The SD family's rules take the target's (``self``) logits; when sampling, draft and target
distributions are both ``logits_to_probs`` at the request's temperature / top-k / top-p.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from prove.decode.config import ENGINE_KEYS, SAMPLING_KEYS, DecodeParams
from prove.decode.engine import CycleView
from prove.decode.proposers import ProposerFactory
from prove.decode.rules.base import Accept
from prove.decode.rules.block import greedy_match, greedy_match_branch, mars_rule, prove_rule
from prove.decode.rules.speculative import AsdState, asd_greedy, nsd_greedy, nsd_sample, sd_sample
from prove.decode.sampling import logits_to_probs, pick, token_prob


@dataclass(frozen=True)
class OnVllm:
    """How vLLM runs a method (``backend=vllm``, ``prove.decode.vllm``): what proposes, and whose rule decides."""

    drafter: str | None = None
    """Who drafts for vLLM's target: None (no speculation: AR), ``model`` (the MARS checkpoint itself) or ``draft``
    (the draft model)."""
    parallel: bool = False
    """The drafter fills K placeholders in one pass (vLLM's parallel drafting; K = ``block_size``), else it drafts k
    tokens one by one (K = ``k``)."""
    plugin: bool = False
    """Our rule replaces vLLM's in its step (``prove.decode.vllm.plugin``; greedy only), else vLLM's own lossless
    rejection sampler decides."""
    sample_drafts: bool = False
    """A sampling request drafts from the draft's distribution and puts its probabilities in the ratio test (SD)."""
    verifier_is_target: bool = False
    """The small verifier is vLLM's target and the MARS checkpoint its drafter (ProVe)."""
    bonus: bool = True
    """The rule adds a correction / bonus token after the accepted ones (ProVe's does not)."""


@dataclass(frozen=True)
class Method:
    name: str
    proposer: str | ProposerFactory
    """A key of ``prove.decode.proposers.PROPOSERS`` (or a factory ``(models, params, generator) -> Proposer``)."""
    verifier: str
    """``none``, ``self`` (the target scores the block) or ``small`` (a separate verifier model)."""
    accept: Callable[[CycleView], Accept]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults of the ``DecodeParams`` this method reads (their one home: the CLIs' YAML leaves them null)."""
    uses: tuple[str, ...] = ()
    """The ``DecodeParams`` this method reads beyond sampling (theta, tau, block_size, k, ...)."""
    greedy_only: bool = False
    """True if the rule is defined for temperature 0 only (it errors early otherwise)."""
    summary: str = ""
    check: Callable[[Any], None] | None = None
    """Method-specific checks of the resolved ``DecodeParams`` beyond their own ranges (e.g. NSD's θ ≤ 1);
    raise ``ValueError`` naming the fix. Run by ``resolve_params`` when a Decoder or a CLI starts."""
    lossless: bool | Callable[[Mapping[str, Any]], bool] = False
    """Whether its greedy output is, by construction, exactly the model's greedy output (AR's) token for
    token (docs/design.md §3 "Guarantees"): ``True``, or a predicate of the resolved parameters (ASD is
    exact with a zero budget, gate or mismatch count). Read through :meth:`is_lossless`."""

    branches: bool = False
    """Its rule verifies a proposal's second candidate (``Proposal.branch``) when there is one: the fused
    cycle then proposes one where p̃ is low (``prove.decode.engine.fused``)."""

    twin: str | None = None
    """The sync-free twin of its rule (``prove.decode.rules.twins``) the device cycle runs for it at temperature 0:
    ``greedy`` (greedy matching), ``asd`` (ASD's budget), ``prove`` (the θ gate); None: the composed cycle only."""
    sampled_twin: bool = False
    """At temperature > 0 the device cycle runs speculative sampling's twin for it (ar, sd)."""
    vllm: OnVllm | None = None
    """How vLLM runs it, or None (then ``vllm_why`` says why not)."""
    vllm_why: str = "vLLM has no such verification"

    def is_lossless(self, params: Mapping[str, Any]) -> bool:
        """Whether a greedy decode with ``params`` (the resolved values of ``uses``) must reproduce AR."""
        return self.lossless(params) if callable(self.lossless) else self.lossless

    def unread(self, given: Mapping[str, Any] | set[str]) -> list[str]:
        """The method parameters in ``given`` that this method does not read (sampling keys and the seed
        apply to every method, so they are never unread)."""
        return sorted(set(given) & set(METHOD_KEYS) - set(self.uses))

    @property
    def needs_verifier(self) -> bool:
        """A separate small verifier model scores the proposals (ProVe)."""
        return self.verifier == "small"

    @property
    def needs_draft(self) -> bool:
        """A separate small model proposes: AR drafting (the SD family) or block drafting (pard)."""
        return self.proposer in ("draft", "draft-block")

    @property
    def drafts_blocks(self) -> bool:
        """The draft model is a block proposer (pard): it, not the target, needs ``<|mask|>`` and a trained K."""
        return self.proposer == "draft-block"

    def with_proposer(self, proposer: str) -> Method:
        """The same rule and verifier on another proposer: NSD's nucleus or ASD's budget on the block
        proposer self-verified (``method=nsd proposer=block``), or ProVe's gate on a draft model. The size
        parameter follows the proposer (``k`` for ``draft``, ``block_size`` for ``block``)."""
        if proposer == self.proposer:
            return self
        if (
            proposer not in _SIZE_PARAM
            or not isinstance(self.proposer, str)
            or self.proposer not in _SIZE_PARAM
        ):
            raise ValueError(
                f"proposer={proposer!r} cannot replace the proposer of method {self.name}: "
                f"methods that propose ({', '.join(sorted(_SIZE_PARAM))}) can swap between {sorted(_SIZE_PARAM)}"
            )
        old, new = _SIZE_PARAM[self.proposer], _SIZE_PARAM[proposer]
        uses = tuple(new if u == old else u for u in self.uses if u not in FUSE_PARAMS)
        defaults = {k: v for k, v in self.defaults.items() if k != old and k not in FUSE_PARAMS}
        if new == "k":
            defaults["k"] = DRAFT_K
        if proposer == "block" and self.verifier == "self":  # the model verifies block proposals: fusable
            uses += FUSE_PARAMS
            defaults.update(FUSE_DEFAULTS)
        return dataclasses.replace(  # its rule composed on another proposer: the composed cycle, not on vLLM
            self,
            name=f"{self.name}[{proposer}]",
            proposer=proposer,
            uses=uses,
            defaults=defaults,
            twin=None,
            sampled_twin=False,
            vllm=None,
            vllm_why="proposer= composes rules on our engine",
        )

    @property
    def can_fuse(self) -> bool:
        """Block proposals verified by the model itself: the verification pass can draft the next block
        (``fuse=true``, ``prove.decode.engine.fused``)."""
        return self.proposer == "block" and self.verifier == "self"

    @property
    def needs_mask(self) -> bool:
        """Block proposers need the checkpoint's ``<|mask|>`` token."""
        return self.proposer == "block"


_SIZE_PARAM = {"block": "block_size", "draft": "k"}
FUSE_PARAMS = ("fuse", "fuse_groups")
"""The parameters of fused verify-and-draft, read by every method that ``can_fuse``."""
FUSE_DEFAULTS = {"fuse": False, "fuse_groups": "auto"}
"""Unfused by default (unfused is the published method; fused is not yet timed on a GPU). Fused needs a
third fewer passes but widens each: J = all (64 tokens for K = 8) pays where width is cheap (a GPU), 1–2
groups on the demo's CPU; ``auto`` (the default J) picks the groups and their lengths per cycle by the device's
measured pass-cost curve (``prove.decode.engine.fused.choose_groups_by_cost``)."""
DRAFT_K = 5
"""Tokens a draft model proposes per cycle unless ``k`` says otherwise (the SD family's usual k = 5)."""
"""The parameter that sets how many tokens each proposer proposes per cycle (block_size: None = trained)."""

METHODS: dict[str, Method] = {}

METHOD_KEYS = tuple(k for k in DecodeParams.field_names() if k not in (*SAMPLING_KEYS, *ENGINE_KEYS))
"""The ``DecodeParams`` that only some methods read (``Method.uses``); the sampling keys, the seed and the
engine's ``fast`` and ``pad_widths`` apply to every method."""


def resolve_params(
    method: str | Method, proposer: str | None = None, **given: Any
) -> tuple[Method, DecodeParams]:
    """The method (on ``proposer`` if given) and its complete, validated ``DecodeParams``: ``given`` values
    (``None`` = the method's default) over the method's defaults. Every check that does not need a model
    runs here, so the Decoder and the CLIs refuse a bad value at start, before any model loads: the ranges
    of ``DecodeParams``, a sampling temperature on a greedy-only method, the method's own ``check``.
    ``block_size = None`` stays None (the checkpoint's trained size, resolved by the Decoder)."""
    m = get_method(method)
    if proposer is not None:
        m = m.with_proposer(proposer)
    unknown = set(given) - set(DecodeParams.field_names())
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; known: {DecodeParams.field_names()}")
    params = DecodeParams(**{k: v for k, v in given.items() if v is not None}).with_defaults(dict(m.defaults))
    if m.greedy_only and params.temperature > 0:
        raise ValueError(
            f"method {m.name} is greedy (exactly the model's greedy output): set temperature=0, "
            "or use a sampling method such as sd"
        )
    if params.fuse and not m.can_fuse:
        raise ValueError(
            f"fuse=true needs block proposals that the model verifies itself: method=prove-lossless, or "
            f"method=nsd / asd with proposer=block (not {m.name})"
        )
    if params.fuse and params.temperature > 0:
        raise ValueError("fuse=true is greedy only: set temperature=0, or fuse=false to sample")
    if params.fuse and params.draft_threshold:
        raise ValueError(
            "draft_threshold cuts unfused proposals; the fused pass sizes its tree by fuse_groups: "
            "set draft_threshold=0, or fuse=false"
        )
    if m.check is not None:
        m.check(params)
    return m, params


def _check_nsd(params: Any) -> None:
    if not 0.0 <= params.theta <= 1.0:
        raise ValueError(
            f"nsd's theta={params.theta} is a nucleus mass: pass a value in [0, 1] (0 = exact SD)"
        )


def _check_prove(params: Any) -> None:
    if not 0.0 <= params.theta <= 1.0:
        raise ValueError(
            f"prove's theta={params.theta} bounds p̃·q, a product of probabilities: pass a value in [0, 1] "
            "(above 1 nothing past y_1 is ever accepted, which is method=ar)"
        )


def register_method(method: Method, *, replace: bool = False) -> Method:
    if method.name in METHODS and not replace:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str | Method) -> Method:
    if isinstance(name, Method):
        return name
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; pick one of: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def _ar(view: CycleView) -> Accept:
    assert view.target_logits is not None
    p = view.params
    if p.temperature == 0:
        return greedy_match(view.proposal.tokens, view.target_logits)
    probs = logits_to_probs(view.target_logits[0], p.temperature, p.top_k, p.top_p)  # (V,)
    return Accept(0, int(pick(probs, p.temperature, view.generator)))


def _mars(view: CycleView) -> Accept:
    return mars_rule(view.proposal.conf, view.params.tau)


def _prove(view: CycleView) -> Accept:
    assert view.verifier_logits is not None
    q = token_prob(view.verifier_logits, view.proposal.tokens)  # (k,)
    return prove_rule(view.proposal.conf, q, view.params.theta)


def _prove_lossless(view: CycleView) -> Accept:
    assert view.target_logits is not None
    prop = view.proposal
    if prop.branch is None:
        return greedy_match(prop.tokens, view.target_logits)
    b, z = prop.branch  # fused: the branch's rows follow the block's k + 1 (``prove.decode.engine.fused``)
    k = prop.k
    return greedy_match_branch(prop.tokens, view.target_logits[: k + 1], b, z, view.target_logits[k + 1 :])


register_method(
    Method(
        "ar",
        "none",
        "self",
        _ar,
        lossless=True,
        summary="one token per pass: the baseline, through the same engine",
        twin="greedy",
        sampled_twin=True,
        vllm=OnVllm(),
    )
)
register_method(
    Method(
        "mars",
        "block",
        "none",
        _mars,
        {"tau": 0.95},
        ("tau", "block_size"),
        summary="MARS confidence rule",
        vllm_why="the MARS confidence rule commits without any verification pass, and vLLM's step always runs its "
        "target to verify (the MARS proposer as vLLM's target would sample its next token, not commit its block)",
    )
)
register_method(
    Method(
        "prove",
        "block",
        "small",
        _prove,
        {"theta": 0.1},
        ("theta", "block_size"),
        summary="ProVe: p̃·q ≥ θ",
        check=_check_prove,
        twin="prove",
        vllm=OnVllm(drafter="model", parallel=True, plugin=True, verifier_is_target=True, bonus=False),
    )
)
register_method(
    Method(
        "prove-lossless",
        "block",
        "self",
        _prove_lossless,
        {**FUSE_DEFAULTS, "draft_threshold": 0.0},
        ("block_size", "draft_threshold", *FUSE_PARAMS),
        greedy_only=True,
        summary="block proposals verified by the model itself: exactly its greedy output",
        lossless=True,
        branches=True,
        twin="greedy",
        vllm=OnVllm(drafter="model", parallel=True),
    )
)


# -- the speculative-decoding family ---------------------------------------------------------------------------


def _sampling_probs(view: CycleView) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft_probs (k, V), target_probs (k+1, V)), both warped alike by the request's sampling params."""
    assert view.target_logits is not None
    p = view.params
    target = logits_to_probs(view.target_logits, p.temperature, p.top_k, p.top_p)  # (k+1, V)
    draft = view.proposal.probs
    if draft is None:  # an empty proposal
        draft = target[:0]
    return draft, target


def _sd(view: CycleView) -> Accept:
    """Speculative decoding (Leviathan et al. 2023; Chen et al. 2023)."""
    assert view.target_logits is not None
    if view.params.temperature == 0:
        return greedy_match(view.proposal.tokens, view.target_logits)
    draft, target = _sampling_probs(view)
    return sd_sample(view.proposal.tokens, draft, target, generator=view.generator)


def _nsd(view: CycleView) -> Accept:
    """Nucleus speculative decoding (Li et al. 2026); greedy: nucleus of the target at temperature 1."""
    assert view.target_logits is not None
    theta = view.params.theta
    if view.params.temperature == 0:
        return nsd_greedy(view.proposal.tokens, view.target_logits, theta)
    draft, target = _sampling_probs(view)
    return nsd_sample(view.proposal.tokens, draft, target, theta, generator=view.generator)


def _asd_exact(params: Mapping[str, Any]) -> bool:
    """ASD commits no mismatch with a zero budget, gate or mismatch count: exactly greedy."""
    return any(params.get(k) == 0 for k in ("budget", "gate", "max_mismatches"))


def _asd(view: CycleView) -> Accept:
    """ASD's rule adapter (Feng et al. 2026). K in its gate is the length of the proposed block (k for the
    draft proposer, the block size for the block proposer; shorter only where the token budget ends). The
    regret spent persists in the request's ``state`` across cycles; the engine starts every request with a
    fresh one."""
    assert view.target_logits is not None
    p = view.params
    verdict, view.state["asd"] = asd_greedy(
        view.proposal.tokens,
        view.target_logits,
        view.state.get("asd", AsdState()),
        budget=p.budget,
        gate=p.gate,
        max_mismatches=p.max_mismatches,
        block_size=view.proposal.k,
    )
    return verdict


register_method(
    Method(
        "sd",
        "draft",
        "self",
        _sd,
        {"k": DRAFT_K, "draft_threshold": 0.0},
        ("k", "draft_threshold"),
        summary="speculative decoding with a small draft model: greedy match, or speculative sampling",
        lossless=True,
        twin="greedy",
        sampled_twin=True,
        vllm=OnVllm(drafter="draft", sample_drafts=True),
    )
)
register_method(
    Method(
        "nsd",
        "draft",
        "self",
        _nsd,
        {"k": DRAFT_K, "theta": 0.9, "draft_threshold": 0.0},
        ("k", "theta", "draft_threshold"),
        summary="nucleus SD: SD, or accept y_i inside the target's top-θ nucleus",
        check=_check_nsd,
        vllm=OnVllm(drafter="draft", plugin=True),
    )
)
register_method(
    Method(
        "asd",
        "draft",
        "self",
        _asd,
        {"k": DRAFT_K, "budget": 8.0, "gate": 0.25, "max_mismatches": 2},
        ("k", "budget", "gate", "max_mismatches"),
        greedy_only=True,
        summary="approximate SD: greedy with a per-request regret budget for mismatches",
        lossless=_asd_exact,
        twin="asd",
        vllm=OnVllm(drafter="draft", plugin=True),
    )
)


# -- a separate block model drafting for the target -----------------------------------------------------------


def _pard(view: CycleView) -> Accept:
    """PARD (Parallel Draft, An et al. 2025): the draft's block, verified by the target's greedy tokens."""
    assert view.target_logits is not None
    return greedy_match(view.proposal.tokens, view.target_logits)


register_method(
    Method(
        "pard",
        "draft-block",
        "self",
        _pard,
        {},
        ("block_size",),
        greedy_only=True,
        summary="a small block model (draft=, MARS-trained) drafts K tokens in one pass; the target verifies",
        lossless=True,
        twin="greedy",
        vllm=OnVllm(drafter="draft", parallel=True),
    )
)
