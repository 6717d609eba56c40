"""A plain Gymnasium env: string observations, `is_success`, a seed picks the task; no textgym import."""

import string

import gymnasium as gym

WORDS = ["apple", "river", "stone", "cloud", "piano", "tiger", "lemon", "chair"]


class EchoEnv(gym.Env):
    """Repeat the word the env says; one turn."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self):
        self.observation_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.word = ""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # textgym poses task i as reset(seed=i)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return f"Say '{self.word}'.", {}  # a string: textgym sends it as one user message

    def step(self, action):
        ok = str(action).strip().strip("'\".").lower() == self.word
        # `is_success` is Gymnasium's convention: textgym's accuracy reads it (as reward/correct)
        return "done", float(ok), True, False, {"is_success": ok}

    def oracle_action(self, messages):  # optional: `textgym eval --agent oracle` and `env check`
        return self.word


gym.register(id="plain/Echo-v0", entry_point=EchoEnv)
