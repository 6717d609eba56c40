"""The stages of `textgym train`, one module each, registered in run order (`registry`).

- `registry`: `STAGES`, `register_stage`, `enabled_stages`, `StageContext`, `StageResult`, `train_stage`
- `evaluate`: the run's evaluations (before a stage, after the last, periodic)
- `sft`, `rl` (`grpo` / `ppo`), `preference` (`dpo`), `rft`, `online_dpo`: the stages
- `rounds`: the round loop of `dpo` and `rft` (sample the latest model → build data → train)
- `process_reward`: the PRM's label and train commands (`textgym prm`), outside `textgym train`

`textgym.pipeline.run` imports the stage modules (which registers them) and loops over the
enabled ones.
"""
