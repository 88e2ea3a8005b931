"""Protocols: the presets' parameters (as specs/methods.md describes each paper), validation,
hashing, and the ratio schedules they produce."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heedful.errors import InputError
from heedful.evaluate import PRESETS, Protocol, get_protocol
from heedful.evaluate.perturbation import Prepared, rationale_sizes


def test_normxlogit_preset_matches_section_2_1():
    p = PRESETS["normxlogit"]
    assert p.removal == "auto"  # [MASK] for encoders, deletion for decoders
    assert p.ratios == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert p.mean_over == (0.1, 0.9)  # AOPC = mean over k = 10..90 %
    assert p.count_base == "all" and p.rounding == "floor"  # int(len(non-pad) * k)
    assert p.specials == "leading"  # [CLS] out of the ranking, [SEP] not
    assert p.label == "predicted" and p.output == "probability"
    assert p.max_length == 90
    assert p.plausibility_specials == "include" and p.dot_normalization == "softmax"
    assert p.mean_mask.tolist() == [False] + [True] * 9 + [False]


def test_mask_lrp_preset_matches_section_1_6():
    p = PRESETS["mask-lrp"]
    assert p.label == "gold" and p.removal_id == 0 and p.token_types == "zeros"
    assert p.min_length == 20 and p.schedule == "linspace" and p.linspace_points == 10
    assert p.count_base == "all" and p.specials == "exclude" and p.skip_lowest
    assert p.output == "probability" and p.mean_over is None
    assert np.allclose(p.curve_ratios, np.linspace(0, 1, 10)[1:])


def test_ferret_preset_matches_section_4_1():
    p = PRESETS["ferret"]
    assert p.removal == "delete" and p.retokenize and p.specials == "exclude"
    assert p.only_positive and p.skip_repeated and p.rationale_k == 5
    assert p.ratios == tuple(np.arange(0.1, 1.1, 0.1).tolist())  # ferret's exact floats
    assert p.count_base == "rankable" and p.empty_rationale == (0.0, 1.0)
    assert p.plausibility_specials == "exclude"


def test_validation_hash_and_changes():
    with pytest.raises(InputError, match="removal"):
        Protocol(removal="blank")
    with pytest.raises(InputError, match="increasing"):
        Protocol(ratios=(0.5, 0.1))
    with pytest.raises(InputError, match="fraction"):
        Protocol(ratios=(2.0,))
    with pytest.raises(InputError, match="no field"):
        PRESETS["ferret"].with_(colour="red")
    with pytest.raises(InputError, match="unknown protocol"):
        get_protocol("eraser")
    p = get_protocol("normxlogit")
    assert p.hash() == dataclasses.replace(p, name="other", random_seeds=2).hash()
    assert p.hash() != p.with_(removal="pad").hash()
    changed = get_protocol("normxlogit", max_length=None)
    assert changed.name == "normxlogit*" and changed.max_length is None
    assert len({q.hash() for q in PRESETS.values()}) == len(PRESETS)


def _prepared(protocol: Protocol, base: list[int], eligible: list[int]) -> Prepared:
    """A stand-in holding only what the schedule reads."""
    bsz, width = len(base), max(base)
    elig = torch.zeros(bsz, width, dtype=torch.bool)
    for b, n in enumerate(eligible):
        elig[b, :n] = True
    return Prepared(
        problem=[0] * bsz, protocol=protocol, scores=None, rankable=elig,
        eligible=elig, ranks=None, base=torch.tensor(base), kept=np.ones(bsz, dtype=bool), original=None,
    )


def test_schedules_of_the_presets():
    # NormXLogit: int(N * k) of all non-pad tokens, capped by the rankable ones (N - 1)
    _, sizes, valid = rationale_sizes(_prepared(PRESETS["normxlogit"], [12], [11]))
    assert sizes[0].tolist() == [int(12 * k) if int(12 * k) <= 11 else 11 for k in PRESETS["normxlogit"].ratios]
    assert valid.all()
    # Mask-LRP: unique(round(linspace(0, 1, 10) * N))[1:]
    _, sizes, valid = rationale_sizes(_prepared(PRESETS["mask-lrp"], [22], [20]))
    expected = list(dict.fromkeys(int(g) for g in np.round(np.linspace(0, 1, 10) * 22)))[1:]
    assert sizes[0][valid[0]].tolist() == [min(k, 20) for k in expected]
    # ferret: int(p * n) of the n content tokens; only positive ones; repeats skipped
    _, sizes, valid = rationale_sizes(_prepared(PRESETS["ferret"], [7], [3]))
    ks = [int(p * 7) for p in np.arange(0.1, 1.1, 0.1)]
    assert sizes[0].tolist() == [min(k, 3) for k in ks]
    kept, last = [], 0
    for k in ks:
        size = min(k, 3)
        kept.append(size > 0 and size != last)
        last = size if size > 0 else last
    assert valid[0].tolist() == kept
    # top-k counts
    _, sizes, _ = rationale_sizes(_prepared(Protocol(schedule="count", ratios=(1, 2, 5)), [6], [4]))
    assert sizes[0].tolist() == [1, 2, 4]
