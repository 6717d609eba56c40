"""The algorithms as pure tensor maths: losses, advantages and their registries.

Nothing here imports from the rest of textgym (a rule `tests/test_layout.py` enforces): every
function takes tensors and hyperparameters and returns tensors and detached float stats, with
its paper's equation in its docstring.

- `aggregate`: the per-token loss reductions (token mean, sequence mean, Dr. GRPO's constant)
- `kl`: the k1 / k2 / k3 KL estimators; `kl_control`: the fixed and adaptive KL coefficients
- `advantages`: the advantage estimators (GRPO, RLOO, REINFORCE++, GAE, ...), registered
- `clipped_loss`: the one clipped core (`clipped_surrogate`) and `ppo_clip`; `policy_losses`:
  GSPO, GSPO-token and CISPO built on it
- `registry`: `Registry`, the class of every registry in textgym (one unknown-name error,
  `UnknownNameError`), and the advantage-estimator and policy-loss registries
- `preference_losses`: DPO, IPO, SimPO, ORPO (registered pair losses) and KTO
- `auxiliary`: entropy, the SFT log-likelihood, the clipped value loss
- `correction`: truncated importance weights for rollouts from another engine (TIS)
"""
