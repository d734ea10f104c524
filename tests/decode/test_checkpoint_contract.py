"""The checkpoint contract at decode time (docs/design.md §2.2): every bad combination is a ValueError that says
what to change, raised when the Decoder is built, never inside a forward pass."""

from __future__ import annotations

import pytest
from prove.decode import Decoder


def test_loads_paths_and_takes_the_trained_block_size(checkpoints, lm, tokenizer):
    dec = Decoder.from_pretrained(checkpoints["mars"], method="prove-lossless")
    assert dec.params.block_size == 4  # from prove.json
    ref = Decoder(lm, tokenizer, method="ar").generate("Ana has", max_new_tokens=12, eos_token_id=[])
    assert dec.generate("Ana has", max_new_tokens=12, eos_token_id=[]).token_ids == ref.token_ids
    assert (
        Decoder(checkpoints["mars"], method="mars", block_size=2).params.block_size == 2
    )  # K ≤ trained is fine


def test_block_method_without_mask_token(checkpoints):
    with pytest.raises(
        ValueError,
        match=r"has no <\|mask\|> token: train it with `prove-train stage=mars` or pick method=ar/sd",
    ):
        Decoder(checkpoints["stock"], method="prove-lossless", block_size=4)
    Decoder(checkpoints["stock"], method="ar")  # AR needs no mask token


def test_block_size_above_trained(checkpoints):
    with pytest.raises(ValueError, match="exceeds the block size 4 .* pass block_size=4 or less"):
        Decoder(checkpoints["mars"], method="prove-lossless", block_size=16)


def test_block_size_unknown_without_prove_json(checkpoints, tmp_path, lm, tokenizer):
    bare = tmp_path / "bare"
    lm.save_pretrained(bare)
    tokenizer.save_pretrained(bare)
    with pytest.raises(ValueError, match="records no trained block size .* pass block_size=K"):
        Decoder(str(bare), method="mars")
    with pytest.warns(UserWarning, match="using block_size=8 as given"):
        Decoder(str(bare), method="mars", block_size=8)


def test_verifier_must_share_the_vocabulary(checkpoints):
    with pytest.raises(ValueError, match=r"verifier .*alien's tokenizer differs from model .*mars's"):
        Decoder(checkpoints["mars"], method="prove", verifier=checkpoints["alien"])
    Decoder(checkpoints["mars"], method="prove", verifier=checkpoints["verifier"])
    # A stock verifier lacks only the <|mask|> that MARS training added: ProVe's normal setting.
    dec = Decoder(checkpoints["mars_on_stock"], method="prove", verifier=checkpoints["stock"])
    stats = dec.generate("Ben has", max_new_tokens=6, eos_token_id=[]).stats
    assert stats.new_tokens == 6 and stats.verifier_passes == stats.cycles > 0


def test_method_needs_its_models_and_known_params(checkpoints):
    with pytest.raises(ValueError, match="method=prove needs a verifier: pass verifier=PATH"):
        Decoder(checkpoints["mars"], method="prove")
    with pytest.raises(ValueError, match="unknown method 'provee'; pick one of: .*prove-lossless"):
        Decoder(checkpoints["mars"], method="provee")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['thetaa'\]"):
        Decoder(checkpoints["mars"], method="prove", verifier=checkpoints["verifier"], thetaa=0.1)
    with pytest.raises(ValueError, match="top_p=0 must lie in"):
        Decoder(checkpoints["mars"], method="ar", top_p=0)
    with pytest.warns(UserWarning, match=r"method mars does not read \['theta'\]"):
        Decoder(checkpoints["mars"], method="mars", theta=0.3)


def test_mask_token_without_embedding_row(tmp_path, make_lm, stock_tokenizer):
    """A <|mask|> added to the tokenizer without resizing the embeddings."""
    import copy

    from prove.common.checkpoint import MASK_TOKEN

    tok = copy.deepcopy(stock_tokenizer)
    path = tmp_path / "unresized"
    make_lm(seed=4, vocab=len(tok)).save_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    tok.save_pretrained(path)
    with pytest.raises(ValueError, match="has no embedding row .* which resizes the embeddings"):
        Decoder(str(path), method="prove-lossless", block_size=4)


def test_an_unused_verifier_is_not_loaded(checkpoints):
    with pytest.warns(UserWarning, match="does not use the verifier .* ignoring it"):
        dec = Decoder(checkpoints["mars"], method="prove-lossless", verifier=checkpoints["verifier"])
    assert dec.models.verifier is None and dec.probe is None
    traced = Decoder(
        checkpoints["mars"], method="prove-lossless", verifier=checkpoints["verifier"], trace=True
    )
    assert traced.models.verifier is not None and traced.probe is not None
