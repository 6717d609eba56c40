"""Stages of `textgym train` that are more than one trainer: rounds of rollouts and training.

`textgym.pipeline.run` calls them in order; each module holds one stage's loop.
"""
