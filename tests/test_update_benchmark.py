"""The update benchmark's pure helpers: which groups are uniform, and the model-FLOP count its
MFU rests on (checked against torch's own count of the executed matmuls)."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load
from tiny_models import tiny_causal_lm
from torch.utils.flop_counter import FlopCounterMode

bench = load("update_throughput")


@pytest.mark.parametrize(
    ("prompts", "fraction", "expected"),
    [
        (4, 0.5, [False, True, False, True]),
        (4, 0.0, [False] * 4),
        (4, 1.0, [True] * 4),
        (6, 1 / 3, [False, False, True, False, False, True]),
    ],
)
def test_uniform_groups_count_and_spread(prompts, fraction, expected):
    assert bench.uniform_groups(prompts, fraction) == expected


def test_uniform_groups_rejects_a_fraction_outside_0_1():
    with pytest.raises(ValueError, match="fraction"):
        bench.uniform_groups(4, 1.5)


def _forward(model, input_ids, attention_mask, completion):
    width = input_ids.shape[1]
    keep = torch.arange(width - completion - 1, width - 1)
    return model(
        input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, use_cache=False
    ).logits


def test_weight_matmul_flops_match_torch_count_without_padding():
    """One unpadded row: the weight-matmul part equals what torch executes (forward, and 3x
    under grad); the attention part is the causal closed form."""
    model = tiny_causal_lm(50, hidden_size=64, num_layers=2)
    length, completion = 20, 7
    ids = torch.randint(3, 50, (1, length))
    mask = torch.ones(1, length, dtype=torch.long)
    tally = bench.FlopTally(model)
    with torch.no_grad(), FlopCounterMode(display=False) as counter, tally.attached():
        _forward(model, ids, mask, completion)
    assert tally.linear == counter.get_total_flops()
    layers, width = 2, 64
    assert tally.attention == 2 * layers * width * length * (length + 1)
    assert tally.scoring_passes == 1 and tally.trained_tokens == 0

    trained = bench.FlopTally(model)
    with FlopCounterMode(display=False) as counter, trained.attached():
        _forward(model, ids, mask, completion).sum().backward()
    assert trained.trained_tokens == completion
    assert trained.linear == 3 * tally.linear == counter.get_total_flops()


def test_padding_is_not_counted():
    """A left-padded prompt and a right-padded completion count as the unpadded row."""
    model = tiny_causal_lm(50, hidden_size=64, num_layers=2)
    ids = torch.randint(3, 50, (1, 12))
    plain = bench.FlopTally(model)
    with torch.no_grad(), plain.attached():
        _forward(model, ids, torch.ones(1, 12, dtype=torch.long), 5)
    # 3 pad columns before the prompt, 2 after the completion (whose width becomes 7).
    padded_ids = torch.nn.functional.pad(ids, (3, 2))
    padded_mask = torch.nn.functional.pad(torch.ones(1, 12, dtype=torch.long), (3, 2))
    padded = bench.FlopTally(model)
    with torch.no_grad(), padded.attached():
        _forward(model, padded_ids, padded_mask, 7)
    assert (padded.linear, padded.attention) == (plain.linear, plain.attention)
