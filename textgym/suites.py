"""Moved to `textgym.evaluation.suites`; this module keeps the old import path working."""

from textgym.evaluation.suites import (
    BUILTIN_SUITES,
    Z_95,
    EvalResult,
    Suite,
    SuiteEnv,
    bootstrap_interval,
    compare_reports,
    env_report,
    load_suite,
    markdown_table,
    mcnemar_p,
    pass_at_k,
    plot_report,
    run_suite,
    wilson_interval,
    write_report,
)

__all__ = [
    "BUILTIN_SUITES",
    "Z_95",
    "EvalResult",
    "Suite",
    "SuiteEnv",
    "bootstrap_interval",
    "compare_reports",
    "env_report",
    "load_suite",
    "markdown_table",
    "mcnemar_p",
    "pass_at_k",
    "plot_report",
    "run_suite",
    "wilson_interval",
    "write_report",
]
