"""Rollout sources besides the trainer's own model.

- `vllm_engine`: an in-process vLLM engine and its weight sync
- `remote`: rollout servers over HTTP (OpenAI-compatible), their weight pushes
- `async_producer`: a background producer sampling up to k policy versions ahead (async RL)
"""
