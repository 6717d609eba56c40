"""What each model holds in memory on this rank: parameters, gradients and optimizer state."""

from __future__ import annotations

import torch


def memory_report(
    models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]],
) -> dict[str, dict[str, float]]:
    """Bytes each model holds on this rank, in MiB: parameters, gradients and optimizer state.

    Sharded parameters count their local shard. Optimizer state counts what the optimizer
    holds, or — before its first step, when it holds nothing yet — what AdamW will hold:
    two moments per trainable element in the parameter's dtype. Activations and the
    all-gathered blocks of a forward are not included.

    Args:
        models: name → (model, its optimizer or None for a frozen model).

    Returns:
        name → {"params_m": parameters in millions (whole model), "param_mib", "grad_mib",
        "optim_mib" (this rank's bytes / 2**20)}.
    """
    mib = 2.0**20
    out: dict[str, dict[str, float]] = {}
    for name, (model, optimizer) in models.items():
        total = local = trainable = 0
        for p in model.parameters():
            shard_p = p.to_local() if hasattr(p, "to_local") else p
            total += p.numel()
            local += shard_p.numel() * shard_p.element_size()
            if p.requires_grad:
                trainable += shard_p.numel() * shard_p.element_size()
        optim = 0.0
        if optimizer is not None:
            held = [
                v.to_local() if hasattr(v, "to_local") else v
                for s in optimizer.state.values()
                for v in s.values()
                if isinstance(v, torch.Tensor)
            ]
            optim = sum(t.numel() * t.element_size() for t in held) if held else 2.0 * trainable
        out[name] = {
            "params_m": total / 1e6,
            "param_mib": local / mib,
            "grad_mib": (trainable if optimizer is not None else 0) / mib,
            "optim_mib": optim / mib,
        }
    return out


def format_memory_report(report: dict[str, dict[str, float]]) -> str:
    """One line per model: `policy 1.8M params · 7.0 MiB params + 7.0 grads + 14.0 optimizer per rank`."""
    lines = []
    for name, r in report.items():
        lines.append(
            f"{name} {r['params_m']:.1f}M params · {r['param_mib']:.1f} MiB params"
            f" + {r['grad_mib']:.1f} grads + {r['optim_mib']:.1f} optimizer per rank"
        )
    return "\n".join(lines)
