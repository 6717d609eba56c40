"""`textgym serve` under concurrent load from the official `openai` client, side by side with one at a time.

Serves MODEL_DIR (default: a freshly built tiny preset) on 127.0.0.1 in this process, then
sends `--requests` chat requests ("Compute i+i.", `--max-tokens` tokens, temperature 1)
twice: all at once from `AsyncOpenAI` (the server's worker batches what is waiting), and one
after another. Counts errors and times both.

    python bench/serve_concurrency.py [MODEL_DIR] [--backend transformers|vllm] [--requests 64]
                                      [--max-tokens 16] [--threads N]

Last line: `concurrent/sequential wall-time ratio (<backend>): X.XX`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import threading
import time
from pathlib import Path


def serve(app):  # type: ignore[no-untyped-def]
    """Run `app` with uvicorn in a thread on a free port; returns (base URL, server)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


async def load(url: str, requests: int, max_tokens: int, concurrent: bool) -> tuple[int, int, float]:
    """(errors, completion tokens, seconds) of `requests` chat requests, all at once or in turn."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)

    def ask(i: int):  # type: ignore[no-untyped-def]
        msg = [{"role": "user", "content": f"Compute {i}+{i}."}]
        return client.chat.completions.create(model="m", messages=msg, max_tokens=max_tokens, temperature=1.0)

    t0 = time.perf_counter()
    if concurrent:
        rs = await asyncio.gather(*[ask(i) for i in range(requests)], return_exceptions=True)
    else:
        rs = []
        for i in range(requests):
            try:
                rs.append(await ask(i))
            except Exception as e:
                rs.append(e)
    seconds = time.perf_counter() - t0
    await client.close()
    errors = sum(isinstance(r, Exception) for r in rs)
    tokens = sum(r.usage.completion_tokens for r in rs if not isinstance(r, Exception) and r.usage)
    return errors, tokens, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--backend", default="transformers")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from textgym.model_init import init_model
    from textgym.serve import build_app

    with tempfile.TemporaryDirectory() as d:
        model_dir = Path(args.model_dir) if args.model_dir else init_model("tiny", Path(d) / "tiny", seed=0)
        kw = {"vllm_kwargs": {"dtype": "float32"}} if args.backend == "vllm" else {}
        app = build_app(model_dir, "m", backend_name=args.backend, **kw)
        url, server = serve(app)
        asyncio.run(load(url, 4, args.max_tokens, True))  # warm-up
        res = {}
        for concurrent in (True, False):
            errors, tokens, seconds = asyncio.run(load(url, args.requests, args.max_tokens, concurrent))
            mode = "concurrent" if concurrent else "sequential"
            res[mode] = seconds
            print(f"{mode}: {args.requests} requests, {errors} errors, {tokens} tokens out, {seconds:.2f} s")
        server.should_exit = True
        ratio = res["concurrent"] / res["sequential"]
        print(f"concurrent/sequential wall-time ratio ({args.backend}): {ratio:.2f}")


if __name__ == "__main__":
    main()
