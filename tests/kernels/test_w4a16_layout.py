"""The strip layout of ``kernels/w4a16_layout.py``: the same words as AutoAWQ's ``qweight``, each
16-word column strip contiguous along K."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels.w4a16_layout import STRIP_WORDS, from_strips, to_strips


def test_strips_place_every_word_and_invert() -> None:
    k, n8 = 6, 48
    qweight = torch.arange(k * n8, dtype=torch.int32).view(k, n8)
    strips = to_strips(qweight)
    assert strips.shape == (n8 // STRIP_WORDS, k, STRIP_WORDS) and strips.is_contiguous()
    for row in range(k):
        for word in range(n8):  # word (row, word) at strip word // 16, row, word % 16
            assert strips[word // STRIP_WORDS, row, word % STRIP_WORDS] == qweight[row, word]
    flat = strips.flatten()  # a strip's rows one after the other: 16 words of row 0, then of row 1
    assert torch.equal(
        flat[: 2 * STRIP_WORDS], torch.cat([qweight[0, :STRIP_WORDS], qweight[1, :STRIP_WORDS]])
    )
    assert torch.equal(from_strips(strips), qweight)


def test_strips_refuse_partial_strips() -> None:
    with pytest.raises(ValueError, match="strip width 16"):
        to_strips(torch.zeros(4, 24, dtype=torch.int32))
