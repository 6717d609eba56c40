"""textgym: text environments, verifiers and RL trainers for LLM agents.

`import textgym` registers the `textgym/...` environment ids with Gymnasium, so
`gymnasium.make("textgym/GSM8K-v0")` works. Modules that moved are in `textgym._moved.MOVED`:
importing one by its old path raises a `ModuleNotFoundError` naming where it went.
"""

from textgym import _moved
from textgym import envs as envs  # registers the environments

_moved.install()  # an old module path fails with an error naming the new one (`textgym._moved`)

__version__ = "0.1.0"
