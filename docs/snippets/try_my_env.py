"""Run from the folder holding my_env.py: python try_my_env.py"""

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

import my_env  # noqa: F401  (registers my/Reverse-v0 and my/Guess-v0)

env = gym.make("my/Reverse-v0")
obs, info = env.reset(options={"task_index": 0})
print(obs)  # [{'role': 'user', 'content': "Spell 'apple' backwards."}]
obs, reward, terminated, truncated, info = env.step("That is elppa.")
print(reward, terminated, info["reward/correct"], info["details"])  # 1.0 True 1.0 {'correct': {'said': 'elppa'}}

env = gym.make("my/Guess-v0")
obs, info = env.reset(options={"task_index": 41})  # the number 42
for guess in ["50", "25", "42"]:
    obs, reward, terminated, truncated, info = env.step(guess)
    print(guess, obs, reward, terminated)  # 50 [... 'lower'] 0.0 False / 25 [... 'higher'] ... / 42 [] 1.0 True

check_env(gym.make("my/Reverse-v0").unwrapped)
check_env(gym.make("my/Guess-v0").unwrapped)
print("check_env passed")
