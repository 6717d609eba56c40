"""Moved to `textgym.evaluation.plotting`; this module keeps the old import path working."""

from textgym.evaluation.plotting import plot_metrics, plot_run

__all__ = ["plot_metrics", "plot_run"]
