"""An evaluation harness that speaks the OpenAI API (inspect-ai) against `textgym serve`.

Starts `textgym serve MODEL_DIR` in a subprocess on a free port of 127.0.0.1, then runs an
inspect-ai task of `--n` two-digit additions ("Compute 47+74.", textgym's
Arithmetic prompt) (generate, then the `\\boxed{N}` answer scored by `pattern()`) through inspect's
OpenAI-compatible provider (`openai-api/textgym/<served name>`, base URL and key from
`TEXTGYM_BASE_URL` / `TEXTGYM_API_KEY`), `--max-connections` requests in flight. Offline.

inspect-ai pins older `fsspec` and `python-dateutil` than textgym's environment holds, so it
runs from a venv of its own; the server runs from textgym's:

    python -m venv /tmp/inspect-venv && /tmp/inspect-venv/bin/pip install inspect-ai openai
    .venv/bin/textgym model init --out /tmp/tiny
    /tmp/inspect-venv/bin/python bench/serve_inspect.py /tmp/tiny --textgym .venv/bin/textgym

Last line: `inspect-ai vs textgym serve: N samples, E errors, accuracy A, S s`.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Poll `url/v1/models` until it answers.

    Raises:
        RuntimeError: when the server exits or does not answer within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"textgym serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"textgym serve did not answer within {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--textgym", default="textgym", help="the textgym CLI (of textgym's venv)")
    ap.add_argument("--backend", default="transformers")
    ap.add_argument("--n", type=int, default=5, help="questions")
    ap.add_argument("--max-connections", type=int, default=8)
    args = ap.parse_args()

    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import GenerateConfig
    from inspect_ai.scorer import pattern
    from inspect_ai.solver import generate

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [args.textgym, "serve", args.model_dir, "--port", str(port), "--served-model-name", "tiny"]
    proc = subprocess.Popen([*cmd, "--backend", args.backend])
    try:
        wait_ready(url, proc)
        os.environ["TEXTGYM_BASE_URL"] = url + "/v1"
        os.environ["TEXTGYM_API_KEY"] = "x"
        samples = [
            Sample(input=f"Compute {a}+{b}.", target=str(a + b))
            for a, b in [(10 + (37 * i) % 90, 10 + (53 * i + 11) % 90) for i in range(args.n)]
        ]
        config = GenerateConfig(max_tokens=16, temperature=0.0, seed=0)
        task = Task(dataset=samples, solver=generate(), scorer=pattern(r"\\boxed\{(-?\d+)\}"), config=config)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as logs:
            (log,) = eval(
                task,
                model="openai-api/textgym/tiny",
                log_dir=logs,
                display="none",
                max_connections=args.max_connections,
            )
            seconds = time.perf_counter() - t0
            n = len(log.samples or [])
            errors = sum(1 for s in log.samples or [] if s.error is not None)
            acc = (
                log.results.scores[0].metrics["accuracy"].value
                if log.results and log.results.scores
                else None
            )
            first = log.samples[0].output.completion if log.samples else None
            print(f"status: {log.status}; first reply: {first!r}")
            print(
                f"inspect-ai vs textgym serve: {n} samples, {errors} errors, accuracy {acc}, {seconds:.1f} s"
            )
        if log.status != "success" or errors:
            print(log.error, file=sys.stderr)
            sys.exit(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
