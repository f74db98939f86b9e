"""reinforce_plus_plus_baseline in CGP (verl_pipe/trainer/whitening.py), pure torch: the affine form of verl's
batch whitening, and the gradient identity the gradient buffers rely on, on verl's own vanilla PPO loss."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo.core_algos import (
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    get_policy_loss_fn,
    kl_penalty,
)
from verl_pipe.trainer.whitening import (BASIS_C, BASIS_ONE, BASIS_ZERO, affine_coefficients, basis_advantages, combination,
                                 has_aux_loss)


def _batch(seed: int, groups: int = 4, n: int = 4, length: int = 10):
    g = torch.Generator().manual_seed(seed)
    rows = groups * n
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), lengths - 1] = torch.randint(0, 5, (rows,), generator=g).float() / 4
    index = np.array([f"g{i // n}" for i in range(rows)], dtype=object)
    return rewards, mask, index


@pytest.mark.parametrize("seed", range(5))
def test_affine_form_equals_verls_whitening(seed):
    rewards, mask, index = _batch(seed)
    expected, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask, index)
    alpha, beta = affine_coefficients(rewards, mask, index)
    c = basis_advantages(rewards, mask, index, with_aux=False)[BASIS_C]
    torch.testing.assert_close((alpha * c + beta) * mask, expected, atol=2e-6, rtol=1e-5)
    assert alpha > 0


def test_centered_scores_are_per_group():
    """A group's basis advantages do not depend on the other groups (so they exist when it completes)."""
    rewards, mask, index = _batch(7)
    whole = basis_advantages(rewards, mask, index, with_aux=True)
    part = basis_advantages(rewards[:4], mask[:4], index[:4], with_aux=True)
    for name in (BASIS_C, BASIS_ONE, BASIS_ZERO):
        torch.testing.assert_close(part[name], whole[name][:4], atol=0, rtol=0)


class _Policy(torch.nn.Module):
    """Per-token log-probs from a linear map: enough for a real gradient through verl's loss."""

    def __init__(self, length: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(length, 3) * 0.1)
        self.x = torch.randn(3)

    def forward(self, rows: int):
        return torch.nn.functional.logsigmoid(self.w @ self.x)[None, :].expand(rows, -1) - 0.1 * torch.arange(rows)[:, None]


def _config(clip=0.2):
    cfg = OmegaConf.create({"clip_ratio": clip, "clip_ratio_low": clip, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                            "global_batch_info": {}, "loss_agg_mode": "token-mean"})
    return cfg


def _grad(policy, old_log_prob, adv, mask, kl_coef: float, ref):
    policy.zero_grad()
    log_prob = policy(adv.shape[0])
    pg, _ = get_policy_loss_fn("vanilla")(old_log_prob=old_log_prob, log_prob=log_prob, advantages=adv,
                                          response_mask=mask.bool(), loss_agg_mode="token-sum", config=_config())
    loss = pg
    if kl_coef:
        loss = loss + kl_coef * (kl_penalty(log_prob, ref, "low_var_kl") * mask).sum()
    loss.backward()
    return policy.w.grad.clone()


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_buffers_combine_to_the_gradient_of_the_final_advantages(kl_coef):
    torch.manual_seed(0)
    rewards, mask, index = _batch(3, length=6)
    policy = _Policy(6)
    with torch.no_grad():
        old = policy(len(rewards)) + 1e-7 * torch.randn(len(rewards), 6)  # θ_k: ratio 1 up to rounding
        ref = old - 0.3
    final, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask, index)
    expected = _grad(policy, old, final, mask, kl_coef, ref)
    aux = kl_coef != 0
    alpha, beta = affine_coefficients(rewards, mask, index)
    passes = basis_advantages(rewards, mask, index, with_aux=aux)
    assert set(passes) == ({BASIS_C, BASIS_ONE, BASIS_ZERO} if aux else {BASIS_C, BASIS_ONE})
    combined = sum(coef * _grad(policy, old, passes[name], mask, kl_coef, ref)
                   for name, coef in combination(alpha, beta, aux).items())
    torch.testing.assert_close(combined, expected, atol=1e-5, rtol=1e-4)


def test_the_identity_needs_an_unclipped_ratio():
    """Away from θ_k (ratios outside the clip range) the loss is not linear in the advantages: the
    reason unit 0 is the only unit that trains before the batch is complete, and the worker's guard."""
    torch.manual_seed(0)
    rewards, mask, index = _batch(3, length=6)
    policy = _Policy(6)
    with torch.no_grad():
        old = policy(len(rewards)) + 0.5 * torch.randn(len(rewards), 6)  # ratios far from 1
    final, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask, index)
    expected = _grad(policy, old, final, mask, 0.0, None)
    alpha, beta = affine_coefficients(rewards, mask, index)
    passes = basis_advantages(rewards, mask, index, with_aux=False)
    combined = sum(coef * _grad(policy, old, passes[name], mask, 0.0, None)
                   for name, coef in combination(alpha, beta, False).items())
    assert not torch.allclose(combined, expected, atol=1e-5, rtol=1e-4)


def test_aux_pass_only_with_kl_loss_or_entropy():
    assert not has_aux_loss(OmegaConf.create({"use_kl_loss": False, "entropy_coeff": 0.0}))
    assert has_aux_loss(OmegaConf.create({"use_kl_loss": True, "entropy_coeff": 0.0}))
    assert has_aux_loss(OmegaConf.create({"use_kl_loss": False, "entropy_coeff": 0.01}))
