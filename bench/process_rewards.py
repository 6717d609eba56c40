"""Process rewards on multi-step Arithmetic with worked steps: a PRM from Monte-Carlo labels, and PPO with it.

The demonstration of docs/training/process-rewards.md, on CPU with the tiny model:

1. SFT (`configs/prm_arithmetic.yaml`'s sft stage): the tiny model learns to write the worked
   steps of "+*" problems with three 1-digit operands ("2+6*3" -> "6*3=18\\n2+18=20\\n\\boxed{20}")
   until 40% of a greedy probe is right;
2. Monte-Carlo step labels (`textgym prm label`): the SFT policy answers 1024 train-stream
   problems; every step is continued K = 4 times, labelled with the share of continuations that
   reach the correct answer;
3. the PRM (`textgym prm train`): the SFT body with a scalar head at each step's last token, trained
   with BCE on 75% of the problems; step accuracy on the other 25% (against the MC labels and
   against the env's own step checker), beside the majority class;
4. best-of-N on the SFT policy: 8 samples of each of 200 held-out problems, the PRM's pick vs
   majority vote vs pass@n;
5. PPO from the same SFT start for the same 100 steps (`configs/ppo_prm_arithmetic.yaml`): with
   the PRM's step rewards beside the outcome (`reward_source: both`, `process_reward: delta`) and
   with the outcome alone; greedy accuracy on the 500 held-out test problems before and after.

    python bench/process_rewards.py [--out runs/bench_process_rewards] [--seed 0] [--threads 2]

Prints one table per part; the figures also go to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
PRM_CONFIG = ROOT / "configs" / "prm_arithmetic.yaml"
PPO_CONFIG = ROOT / "configs" / "ppo_prm_arithmetic.yaml"
ENV_KW = {"operators": "+*", "digits": 1, "n_terms": 3, "worked_steps": True, "instruction": ""}


def textgym(*args: str) -> float:
    """Run `python -m textgym ...`, failing loudly; return its wall seconds."""
    cmd = [sys.executable, "-m", "textgym", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def label_figures(path: Path) -> dict[str, float]:
    """Answers, steps, answer accuracy, mean labels, agreement with the env's checker: from a labels file."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [
        (s, h, g) for r in rows for s, h, g in zip(r["soft"], r["hard"], r["env_step_rewards"], strict=True)
    ]
    return {
        "answers": len(rows),
        "steps": len(steps),
        "answer_accuracy": sum(r["correct"] for r in rows) / len(rows),
        "checker_right_share": sum(g for _, _, g in steps) / len(steps),
        "soft_mean": sum(s for s, _, _ in steps) / len(steps),
        "hard_mean": sum(h for _, h, _ in steps) / len(steps),
        "soft_agrees_with_checker": sum((s >= 0.5) == (g >= 0.5) for s, _, g in steps) / len(steps),
        "hard_agrees_with_checker": sum((h >= 0.5) == (g >= 0.5) for _, h, g in steps) / len(steps),
    }


def best_of_n_rows(policy: Path, prm: Path, n: int, samples: int, seed: int) -> list[dict]:
    """`textgym eval --prm` as a library call: best-of-n by the PRM, majority vote, pass@n."""
    import torch

    from textgym.config import EvalJobConfig
    from textgym.evaluation.job import run_eval

    torch.manual_seed(seed)
    job = EvalJobConfig.model_validate(
        {
            "env": "textgym/Arithmetic-v0",
            "env_kwargs": {**ENV_KW, "split": "test"},
            "n": n,
            "samples": samples,
            "sampling": {"temperature": 1.0, "max_new_tokens": 32},
            "agent": {"kind": "model", "model": str(policy)},
            "prm": str(prm),
        }
    )
    outcome = run_eval(job)
    assert outcome.best_of_n is not None
    return outcome.best_of_n


def main() -> None:
    """Run the five parts and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_process_rewards")
    ap.add_argument("--seed", type=int, default=0, help="init seed of the tiny model and run seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bon-n", type=int, default=200, help="held-out problems of the best-of-N part")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    common = [f"out_dir={out}", f"seed={args.seed}", f"threads={args.threads}"]
    sft_final = out / "prm_arithmetic" / "sft" / "final"
    labels, prm = out / "prm_arithmetic" / "prm" / "labels.jsonl", out / "prm_arithmetic" / "prm" / "model"
    paths = [f"prm.label.policy={sft_final}", f"prm.label.out={labels}", f"prm.out={prm}"]
    wall: dict[str, float] = {}
    t0 = time.perf_counter()

    # 1 SFT, 2 labels, 3 the PRM
    wall["sft"] = textgym("train", str(PRM_CONFIG), *common, f"model.init_seed={args.seed}", "--overwrite")
    wall["label"] = textgym("prm", "label", str(PRM_CONFIG), *common, *paths, f"prm.label.seed={args.seed}")
    wall["prm_train"] = textgym("prm", "train", str(PRM_CONFIG), *common, *paths, f"prm.seed={args.seed}")
    lab = label_figures(labels)
    prm_res = json.loads((prm / "textgym.json").read_text(encoding="utf-8"))

    # 4 best-of-N on the SFT policy
    t = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    bon = best_of_n_rows(sft_final, prm, args.bon_n, 8, args.seed)
    wall["best_of_n"] = time.perf_counter() - t

    # 5 PPO from the same start: the PRM's step rewards beside the outcome, and the outcome alone
    start = [f"model.path={sft_final}"]
    runs = {
        "ppo_prm": [f"ppo.env.process_reward_model={prm}"],
        "ppo_outcome": ["ppo.reward_source=outcome", "ppo.env.process_reward_model=null"],
    }
    ppo = {}
    for name, extra in runs.items():
        wall[name] = textgym("train", str(PPO_CONFIG), *common, *start, f"name={name}", *extra, "--overwrite")
        ppo[name] = json.loads((out / name / "summary.json").read_text(encoding="utf-8"))
    wall["total"] = time.perf_counter() - t0

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": platform.processor() or platform.machine(),
        "seed": args.seed,
        "threads": args.threads,
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "(own)"),
        "labels": lab,
        "prm": prm_res,
        "best_of_n": bon,
        "ppo": {k: {"before": v["accuracy_before"], "after": v["accuracy_after"]} for k, v in ppo.items()},
        "wall_s": wall,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print_tables(results)


def print_tables(r: dict) -> None:
    """The results as markdown tables."""
    lab, prm = r["labels"], r["prm"]
    print(f"\nMonte-Carlo labels (K = 4): {lab['answers']} answers of the SFT policy "
          f"({lab['answer_accuracy']:.3f} correct), {lab['steps']} steps; the env's checker calls "
          f"{lab['checker_right_share']:.3f} of the steps right; mean soft label {lab['soft_mean']:.3f}, "
          f"hard {lab['hard_mean']:.3f}; soft ≥ 0.5 agrees with the checker on "
          f"{lab['soft_agrees_with_checker']:.3f}, hard on "
          f"{lab['hard_agrees_with_checker']:.3f}\n")  # fmt: skip
    print("| PRM, held-out steps | before training | after | majority class |")
    print("|---|---|---|---|")
    print(f"| step accuracy vs MC labels (soft ≥ 0.5), {prm['heldout_steps']} steps | "
          f"{prm['heldout_step_accuracy_before']:.3f} | {prm['heldout_step_accuracy']:.3f} | "
          f"{prm['heldout_majority_baseline']:.3f} |")  # fmt: skip
    print(f"| step accuracy vs the env's step checker | {prm['heldout_gold_step_accuracy_before']:.3f} | "
          f"{prm['heldout_gold_step_accuracy']:.3f} | |\n")  # fmt: skip
    print("| n (of 8 samples, T = 1) | best-of-n by the PRM (min) | majority vote | pass@n | one sample |")
    print("|---|---|---|---|---|")
    for row in r["best_of_n"]:
        print(f"| {row['n']} | {row['best_of_n']:.3f} | {row['majority']:.3f} | {row['pass_at_n']:.3f} "
              f"| {row['mean']:.3f} |")  # fmt: skip
    print("\n| PPO from the SFT start, same steps | held-out accuracy before | after |")
    print("|---|---|---|")
    names = {"ppo_prm": "outcome + PRM step rewards (delta, w = 0.5)", "ppo_outcome": "outcome only"}
    for k, v in r["ppo"].items():
        print(f"| {names.get(k, k)} | {v['before']:.3f} | {v['after']:.3f} |")
    print("\nwall seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in r["wall_s"].items()))


if __name__ == "__main__":
    main()
