"""Rollout sources: a `RolloutRequest` in, trajectories out (`base.RolloutSource`), never the trainer.

- `base`: the request, the rollout settings read from a stage config, the protocol
- `local`: `AgentSource`, rollouts in this process through an agent (the policy, a vLLM engine,
  the rollout servers' client)
- `vllm_engine`: an in-process vLLM engine and its weight sync
- `remote`: rollout servers over HTTP (OpenAI-compatible) as a source
- `servers`: `RolloutServerGroup`, the servers' checks and weight pushes
- `async_producer`: a background producer sampling up to k policy versions ahead (async RL)
"""
