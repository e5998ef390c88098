"""CenteredClip stays near the honest contributions whatever one contribution is, and is the mean of equal ones."""
from __future__ import annotations

import torch

from hetswarm.client.training.robust_aggregation import centered_clip


def test_one_huge_contribution_moves_the_aggregate_little_and_the_mean_a_lot():
    generator = torch.Generator().manual_seed(0)
    honest = [torch.randn(1000, generator=generator) * 0.1 + 1.0 for _ in range(4)]
    attack = torch.full((1000,), 1e6)
    robust, mean = centered_clip([*honest, attack]), torch.stack([*honest, attack]).mean(0)
    truth = torch.stack(honest).mean(0)
    assert (robust - truth).norm() < 0.5 * (honest[0] - truth).norm() + 1.0
    assert (mean - truth).norm() > 1e5


def test_equal_contributions_aggregate_to_themselves_and_two_are_averaged():
    part = torch.randn(3, 5)
    torch.testing.assert_close(centered_clip([part, part.clone(), part.clone()]), part)
    a, b = torch.zeros(4), torch.ones(4)
    torch.testing.assert_close(centered_clip([a, b]), torch.full((4,), 0.5))
