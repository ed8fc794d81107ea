"""ctxkit.training.rl_masks: which tokens/sequences TIS, an IcePop token mask and TRL's sequence_mask touch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ctxkit.errors import ConfigError
from ctxkit.training.rl_masks import TRL_SEQUENCE_CLIP_MAX, sequence_log_ratios, sequence_mask_keep, tis_touched, token_mask_keep


def test_tis_touches_ratios_strictly_above_clip():
    assert tis_touched([0.5, 2.0, 2.5, 3.0], clip=2.0).tolist() == [False, False, True, True]
    assert tis_touched(np.array([[1.0, 4.0], [0.0, 1.5]]), clip=1.5).tolist() == [[False, True], [False, False]]


def test_token_mask_keeps_the_closed_interval():
    assert token_mask_keep([0.25, 0.5, 1.0, 2.0, 2.5], 0.5, 2.0).tolist() == [False, True, True, True, False]
    assert token_mask_keep([0.0, math.inf]).tolist() == [False, False]


def test_sequence_log_ratios_sum_with_nan_as_zero_like_trl():
    out = sequence_log_ratios([[0.5, 0.25], [math.nan, 1.0], [], [-math.inf, 2.0]])
    assert out.tolist() == [0.75, 1.0, 0.0, -math.inf]


def test_sequence_mask_matches_trl_default_bounds():
    assert TRL_SEQUENCE_CLIP_MAX == 3.0
    seqs = [[1.0, 0.09], [1.1], [-5.0], [math.log(2.0), math.log(2.0)], [1.0986]]
    # exp(1.09) = 2.974 kept; exp(1.1) = 3.004 masked; no lower bound by default; 4 masked; exp(1.0986) = 2.99996 kept
    assert sequence_mask_keep(seqs).tolist() == [True, False, True, False, True]
    assert sequence_mask_keep(seqs, clip_min=0.1).tolist() == [True, False, False, False, True]
    assert sequence_mask_keep(seqs, clip_max=None).tolist() == [True, True, True, True, True]


@pytest.mark.parametrize("call, match", [
    (lambda: tis_touched([1.0], clip=0), r"clip=0: must be a finite number > 0"),
    (lambda: token_mask_keep([1.0], 2.0, 0.5), r"low=2.0 > high=0.5"),
    (lambda: tis_touched([1.0, math.nan]), r"ratios: value nan at flat position 1"),
    (lambda: token_mask_keep([-1.0]), r"ratios: value -1.0 at flat position 0"),
    (lambda: sequence_log_ratios([[[1.0]]]), r"token_log_ratios\[0\]: expected a 1-D array"),
    (lambda: sequence_mask_keep([[1.0]], clip_min=5.0), r"clip_min=5.0 > clip_max=3.0"),
])
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
