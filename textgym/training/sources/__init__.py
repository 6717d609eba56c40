"""Rollout sources.

- `local`: the trainer's own agent, in process, with the stage config's settings
- `vllm_engine`: an in-process vLLM engine and its weight sync
- `remote`: rollout servers over HTTP (OpenAI-compatible), their weight pushes
- `async_producer`: a background producer sampling up to k policy versions ahead (async RL)
"""
