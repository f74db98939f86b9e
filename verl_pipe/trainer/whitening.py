"""Batch-whitened advantages in CGP, exactly: reinforce_plus_plus_baseline as an affine map.

verl's ``reinforce_plus_plus_baseline`` subtracts the group mean from each response's score
(per group, final when the group completes) and then whitens over every response token of
the *batch*: ``A_t = (c_t - μ) ρ`` on the response mask, with μ and ρ = 1/sqrt(var + 1e-8)
from the whole batch. While the first groups train, μ and ρ do not exist yet.

They are only needed as two scalars. On every token ``A_t = α c_t + β`` with α = ρ and
β = -μρ. At θ_k (the first optimizer step of the step, ppo_epochs=1, old log-probs under
θ_k) the PPO ratio is 1 up to rounding, no token is clipped, and verl's vanilla policy
gradient is linear in the advantages. So a group that trains before the batch is complete
runs three gradient passes into separate buffers, with the same loss and advantages

    X: A = c (centered scores)   Y: A = 1 (the response mask)   Z: A = 0

(Z holds what does not depend on A: the KL loss and the entropy bonus; skipped when both
are off, because it is then exactly zero). Once the rollout ends, μ and ρ come from the
whole batch with verl's own masked_mean/masked_var, and the unit's gradient is

    G = G_direct + α X + β Y + (1 - α - β) Z

which is verl's gradient of ``A = α c + β`` (loss linear in A: α(P_c + O) + β(P_1 + O) +
(1 - α - β) O = α P_c + β P_1 + O). Groups that train after the batch is complete (every
later unit, and unit 0's groups that arrive last) use the final advantages directly.

Cost: two (three with KL loss or entropy) forward/backward passes instead of one for each
group trained before the rollout ends, and one gradient-sized buffer per pass on the
trainer; unit 0's optimizer step waits for the end of the rollout.
"""

from __future__ import annotations

import torch

from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.utils import torch_functional as verl_F

BASIS_C, BASIS_ONE, BASIS_ZERO = "centered", "one", "zero"


def centered_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index) -> torch.Tensor:
    """The first half of verl's reinforce_plus_plus_baseline: each response's score minus its group's mean, on
    every response token. verl's GRPO without std normalization is exactly that (the same operations)."""
    centered, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index,
                                                 norm_adv_by_std_in_grpo=False)
    return centered


def affine_coefficients(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index) -> tuple[float, float]:
    """(α, β) of the whole batch: verl's masked_whiten is (c - μ)·rsqrt(var + 1e-8) = α c + β."""
    values = centered_scores(token_level_rewards, response_mask, index)
    mean = verl_F.masked_mean(values, response_mask)
    var = verl_F.masked_var(values, response_mask)
    alpha = torch.rsqrt(var + 1e-8)
    return float(alpha), float(-mean * alpha)


def basis_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                     with_aux: bool) -> dict[str, torch.Tensor]:
    """The advantages of each gradient pass of a group trained before the batch is complete."""
    mask = response_mask.to(token_level_rewards.dtype)
    out = {BASIS_C: centered_scores(token_level_rewards, mask, index), BASIS_ONE: mask.clone()}
    if with_aux:
        out[BASIS_ZERO] = torch.zeros_like(mask)
    return out


def combination(alpha: float, beta: float, with_aux: bool) -> dict[str, float]:
    """Coefficients of the pass buffers in the unit's gradient (see the module docstring)."""
    coeffs = {BASIS_C: alpha, BASIS_ONE: beta}
    if with_aux:
        coeffs[BASIS_ZERO] = 1.0 - alpha - beta
    return coeffs


def has_aux_loss(actor_config) -> bool:
    """Whether the actor's loss has terms that do not depend on the advantages (the Z pass)."""
    return bool(actor_config.get("use_kl_loss", False)) or float(actor_config.get("entropy_coeff", 0.0)) != 0.0
