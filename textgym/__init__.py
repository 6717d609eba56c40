"""textgym: text environments, verifiers and RL trainers for LLM agents.

`import textgym` registers the `textgym/...` environment ids with Gymnasium, so
`gymnasium.make("textgym/GSM8K-v0")` works.
"""

from textgym import envs as envs  # registers the environments

__version__ = "0.1.0"
