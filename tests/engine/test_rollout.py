"""Rollout's helpers: the one place padding is trimmed and completions become text."""

from __future__ import annotations

import torch

from smollab.engine.rollout import Rollout, left_pad


class _Tok:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r)) for r in rows]


def _rollout() -> Rollout:
    ids, mask = left_pad([[1, 5], [1, 6, 7, 8]], pad_token_id=0)
    comp = torch.tensor([[9, 2, 0], [10, 11, 12]])
    cmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return Rollout(ids, mask, comp, cmask, torch.zeros(2, 3), torch.tensor([False, True]))


def test_rows_drop_left_padding_and_what_follows_eos():
    r = _rollout()
    assert r.prompt_rows() == [[1, 5], [1, 6, 7, 8]]
    assert r.completion_rows() == [[9, 2], [10, 11, 12]]


def test_texts_decode_the_trimmed_rows():
    r = _rollout()
    assert r.prompt_texts(_Tok()) == ["1 5", "1 6 7 8"]
    assert r.completion_texts(_Tok()) == ["9 2", "10 11 12"]


def test_distinct_prompts_per_lane_split_into_the_lanes():
    """With lanes, a prompt repeated across lanes is kept once per lane, every lane gets as many
    rows (the short ones repeat their last), and each row maps into its own lane's block."""
    from smollab.engine.rollout import distinct_prompts

    a, b, c = [1, 2, 3], [0, 4, 5], [6, 7, 8]
    ids = torch.tensor([a, a, b, c, c, c])  # lane 0: a a b, lane 1: c c c
    mask = (ids != 0).long()
    u_ids, u_mask, rows = distinct_prompts(ids, mask, lanes=2)
    assert u_ids.shape[0] == 4 and u_mask.shape == u_ids.shape  # 2 per lane
    assert torch.equal(u_ids[rows], ids) and torch.equal(u_mask[rows], mask)
    assert rows[:3].lt(2).all() and rows[3:].ge(2).all()
