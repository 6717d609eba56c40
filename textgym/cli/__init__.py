"""The `textgym` command line (typer). Every command has `--help`.

`textgym --import MODULE COMMAND ...` imports MODULE first, so the envs it registers can be
named by any command (as can `module:Name-v0` ids and the ids of installed packages'
`textgym.envs` entry points; see `textgym.envs.registry`).

Exit codes: 0 success; 1 some input lines failed (score/verify) or a run failed;
2 bad usage or configuration (nothing was written).

One module per command group; each command loads its config, calls one library function and
prints. The whole command tree is registered below:

| command | module | library call |
|---|---|---|
| `envs`, `plot` | `envs` | `textgym.envs.env_ids`, `textgym.evaluation.plotting.plot_run` |
| `env new`, `check`, `show`, `serve-openenv` | `env` | `scaffold`, `envcheck`, `interop.openenv` |
| `train` | `train` | `textgym.pipeline.run` |
| `eval`, `report compare` | `eval` | `textgym.evaluation.job.run_eval`, `evaluation.suites.compare_reports` |
| `score`, `verify math` | `score` | an env's verifier, `textgym.verifiers.math.MathVerifier` |
| `verify judge` | `judge` | `textgym.verifiers.judge.JudgeVerifier` |
| `audit` | `audit` | `textgym.evaluation.audit.run_audit` |
| `model init`, `check-template`, `serve` | `models` | `init_model`, `check_template`, `serve.build_app` |
| `rollouts collect`, `pairs build` | `data` | `textgym.offline.collect_rollouts`, `build_pairs` |
| `rm train` | `rm` | `textgym.pipeline.run_reward_model` |
| `prm label`, `prm train` | `prm` | `textgym.stages.process_reward.run_prm_label`, `run_prm_train` |
| `sandbox check`, `sandbox build-image` | `sandbox` | `textgym.sandbox.check_backends`, `build_image` |
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from textgym.cli import audit, data, env, envs, eval, judge, models, prm, rm, sandbox, score, train

app = typer.Typer(
    help="textgym: text environments, verifiers and RL trainers for LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    imports: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            help="Import MODULE first (repeatable): its gymnasium.register calls add env ids. "
            "Also read from $TEXTGYM_IMPORTS (comma-separated).",
        ),
    ] = None,
) -> None:
    """Import the --import modules before the command runs (and pass them on to child processes)."""
    if imports:
        from textgym.envs.registry import IMPORTS_ENV_VAR, import_modules

        try:
            import_modules(imports)
        except ImportError as e:
            typer.echo(f"error: --import: {e}", err=True)
            raise typer.Exit(2) from None
        earlier = [m for m in os.environ.get(IMPORTS_ENV_VAR, "").split(",") if m]
        os.environ[IMPORTS_ENV_VAR] = ",".join(dict.fromkeys([*earlier, *imports]))


app.command("envs")(envs.envs_cmd)
app.add_typer(env.env_app, name="env")
app.command("train")(train.train_cmd)
app.command("eval")(eval.eval_cmd)
app.add_typer(eval.report_app, name="report")
app.command("score")(score.score_cmd)
score.verify_app.command("judge")(judge.verify_judge_cmd)
app.add_typer(score.verify_app, name="verify")
app.command("audit")(audit.audit_cmd)
app.command("plot")(envs.plot_cmd)
app.add_typer(models.model_app, name="model")
app.command("check-template")(models.check_template_cmd)
app.command("serve")(models.serve_cmd)
app.add_typer(data.rollouts_app, name="rollouts")
app.add_typer(data.pairs_app, name="pairs")
app.add_typer(rm.rm_app, name="rm")
app.add_typer(prm.prm_app, name="prm")
app.add_typer(sandbox.sandbox_app, name="sandbox")


def main() -> None:
    """Entry point of the `textgym` console script (and of `python -m textgym`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    _refuse_ranks_outside_train(sys.argv[1:])
    app(prog_name="textgym")


def _refuse_ranks_outside_train(args: list[str]) -> None:
    """Under torchrun with several processes only `textgym train` and `textgym rm train` split the work.

    Every other command would run once per rank and write the same outputs; it exits with
    code 2 and a message instead.
    """
    rest = list(args)
    while rest and rest[0].startswith("--import"):  # the root option and its value
        rest = rest[1:] if "=" in rest[0] else rest[2:]
    words = [a for a in rest if not a.startswith("-")][:2]
    command = " ".join(words[:1] if words[:1] != ["rm"] else words)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and command not in ("", "train", "rm train"):
        if os.environ.get("RANK", "0") == "0":
            typer.echo(
                f"error: `textgym {command}` runs on one process; only `textgym train` and "
                "`textgym rm train` run under torchrun",
                err=True,
            )
        raise SystemExit(2)


__all__ = ["app", "main"]
