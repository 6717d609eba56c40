"""textgym environments, registered with Gymnasium under `textgym/...` ids on import."""

from gymnasium.envs.registration import register

from textgym.envs.arithmetic import ArithmeticEnv, ArithmeticTasks
from textgym.envs.base import SingleTurnEnv, TextEnv, math_rubric
from textgym.envs.code import CodeEnv, HumanEvalEnv, MBPPEnv
from textgym.envs.interop import register_interop
from textgym.envs.math_qa import GSM8KEnv, MATH500Env
from textgym.envs.registry import EnvError, TextGymAdapter, UnknownEnvError, env_ids, make, task_count
from textgym.envs.spaces import ChatMessages, UnicodeText

register(id="textgym/Arithmetic-v0", entry_point="textgym.envs.arithmetic:ArithmeticEnv")
register(id="textgym/GSM8K-v0", entry_point="textgym.envs.math_qa:GSM8KEnv")
register(id="textgym/MATH500-v0", entry_point="textgym.envs.math_qa:MATH500Env")
register(id="textgym/HumanEval-v0", entry_point="textgym.envs.code:HumanEvalEnv")
register(id="textgym/MBPP-v0", entry_point="textgym.envs.code:MBPPEnv")
register(id="textgym/ToolMath-v0", entry_point="textgym.envs.tool_use:make_tool_math", max_episode_steps=6)
register(id="textgym/WebShop-v0", entry_point="textgym.envs.web.envs:make_webshop", max_episode_steps=15)
register(
    id="textgym/WikiSearch-v0", entry_point="textgym.envs.web.envs:make_wikisearch", max_episode_steps=10
)
register(id="textgym/Wordle-v0", entry_point="textgym.envs.wordle:WordleEnv", max_episode_steps=6)
register(
    id="textgym/GuessNumber-v0", entry_point="textgym.envs.guess_number:GuessNumberEnv", max_episode_steps=7
)
register(
    id="textgym/HumanEvalFeedback-v0",
    entry_point="textgym.envs.code:HumanEvalEnv",
    kwargs={"feedback": True},
    max_episode_steps=3,
)
register(
    id="textgym/MBPPFeedback-v0",
    entry_point="textgym.envs.code:MBPPEnv",
    kwargs={"feedback": True},
    max_episode_steps=3,
)

register_interop()

__all__ = [
    "ArithmeticEnv",
    "ArithmeticTasks",
    "ChatMessages",
    "CodeEnv",
    "EnvError",
    "GSM8KEnv",
    "HumanEvalEnv",
    "MATH500Env",
    "MBPPEnv",
    "SingleTurnEnv",
    "TextEnv",
    "TextGymAdapter",
    "UnicodeText",
    "UnknownEnvError",
    "env_ids",
    "make",
    "math_rubric",
    "task_count",
]
