"""A stand-in LLM judge: an OpenAI-compatible server whose "model" grades with textgym's math verifier.

    python examples/verifier_judge_server.py --port 8008 [--model verifier-judge] [--delay-s 0]

It is NOT a language model. It exists to run and measure textgym's RLAIF plumbing (the judge
reward term, `textgym verify judge`, `textgym audit`) on a machine that has no model able to
judge: every request is answered in the format the built-in rubrics ask for, so the whole path
(rendering the rubric, HTTP, retries, the cache, parsing `SCORE:` lines) runs for real, and the
training curve it gives is the one an ideal judge would give. A judge model's own errors, its
latency and its cost are not measured by it (see docs/judge.md for what that leaves out).

How it grades (the last message of a chat request is the judge prompt of a built-in rubric):

- the gold answer is the `<reference>` block when the prompt has one, else the value of an
  Arithmetic question (`Compute 12+7*3.` in the `<question>` block, evaluated exactly);
- each response (`<response>`, `<response_a>`/`<response_b>` or numbered `<response id="i">`
  blocks; the `&lt;` textgym writes for tag-like text is read back as `<`) is scored 10 when
  `textgym.verifiers.MathVerifier` finds its final answer equal to the gold, else 0;
- the reply ends with its verdict inside the request's verdict tags (their name, with the
  nonce textgym draws for each request, is read from the rubric's instruction):
  `<verdict-…>SCORE: 10|0</verdict-…>` (pointwise), `WINNER: A|B|TIE` (pairwise) or one
  `SCORE i: 10|0` line per response (group); without a gold answer it says so and gives no
  verdict (textgym then scores 0.0 with the reason).

`GET /v1/models` lists the model name; `GET /stats` reports the requests served, their mean
latency in the server, and the request rate since the first one (what `bench/rlaif.py` reads).
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from textgym.envs.arithmetic import evaluate
from textgym.types import Task
from textgym.verifiers import MathVerifier

VERIFIER = MathVerifier(timeout_s=5.0)
QUESTION = re.compile(r"Compute\s+(\d+(?:\s*[-+*/]\s*\d+)*)\s*\.")
TAG = re.compile(r"<(verdict-[0-9a-f]+)>")


def block(prompt: str, tag: str) -> str | None:
    """The text of the first `<tag>` block (the rubric puts each on its own lines), or None."""
    m = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", prompt, re.DOTALL)
    return None if m is None else m.group(1).replace("&lt;", "<")


def gold_answer(prompt: str) -> str | None:
    """The reference block's answer, else the exact value of an Arithmetic question, else None."""
    ref = block(prompt, "reference")
    if ref:
        return ref.strip()
    m = QUESTION.search(block(prompt, "question") or "")
    if m is None:
        return None
    nums = [int(x) for x in re.findall(r"\d+", m.group(1))]
    ops = re.findall(r"[-+*/]", m.group(1))
    try:
        value = evaluate(nums, ops)
    except (ZeroDivisionError, ValueError):
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def grade(response: str, gold: str) -> int:
    """10 when the response's final answer equals `gold` (math-verify), else 0."""
    return 10 if VERIFIER(response, Task(task_id="judge", prompt="", answer=gold)).reward == 1.0 else 0


def judge(prompt: str) -> str:
    """The stand-in judge's reply to one judge prompt."""
    gold = gold_answer(prompt)
    tag = TAG.search(prompt)  # inserted text cannot hold one: textgym writes its `<` as `&lt;`
    if gold is None or tag is None:
        return "I cannot tell the right answer to this question, so I give no verdict."

    def verdict(text: str) -> str:
        return f"<{tag.group(1)}>{text}</{tag.group(1)}>"

    group = re.findall(r'<response id="(\d+)">\n(.*?)\n</response>', prompt, re.DOTALL)
    if group:
        lines = [f"SCORE {i}: {grade(text.replace('&lt;', '<'), gold)}" for i, text in group]
        return f"The right answer is {gold}.\n" + verdict("\n" + "\n".join(lines) + "\n")
    a, b = block(prompt, "response_a"), block(prompt, "response_b")
    if a is not None and b is not None:
        sa, sb = grade(a, gold), grade(b, gold)
        return f"The right answer is {gold}.\n" + verdict(
            "WINNER: " + ("TIE" if sa == sb else "A" if sa > sb else "B")
        )
    score = grade(block(prompt, "response") or "", gold)
    said = "right" if score else "wrong"
    return f"The right answer is {gold}; the response's is {said}.\n" + verdict(f"SCORE: {score}")


class Stats:
    """Requests served, their summed latency and the time of the first and last one (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests, self.latency_s, self.first, self.last = 0, 0.0, 0.0, 0.0

    def add(self, t0: float, t1: float) -> None:
        """Count one request served from `t0` to `t1` (monotonic seconds)."""
        with self.lock:
            self.requests += 1
            self.latency_s += t1 - t0
            self.first = self.first or t0
            self.last = t1

    def as_dict(self) -> dict[str, Any]:
        """`requests`, `latency_s_mean` and `requests_per_s` between the first and the last request."""
        with self.lock:
            span = self.last - self.first
            return {
                "requests": self.requests,
                "latency_s_mean": self.latency_s / self.requests if self.requests else 0.0,
                "requests_per_s": self.requests / span if span > 0 else 0.0,
                "span_s": span,
            }


def make_server(host: str, port: int, model: str, delay_s: float = 0.0) -> ThreadingHTTPServer:
    """The HTTP server (not started): chat completions, models, health and stats."""
    stats = Stats()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.rstrip("/")
            if path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif path == "/health":
                self.send(200, {"status": "ok"})
            elif path == "/stats":
                self.send(200, stats.as_dict())
            else:
                self.send(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})

        def do_POST(self) -> None:
            t0 = time.monotonic()
            if self.path.rstrip("/") != "/v1/chat/completions":
                self.send(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompt = str(body["messages"][-1]["content"])
            except (ValueError, KeyError, IndexError, TypeError):
                self.send(
                    400, {"error": {"message": "expected a chat request", "type": "invalid_request_error"}}
                )
                return
            if body.get("model") != model:
                msg = f"model {body.get('model')!r} is not served here; this server serves {model!r}"
                self.send(
                    404, {"error": {"message": msg, "type": "not_found_error", "code": "model_not_found"}}
                )
                return
            time.sleep(delay_s)
            text = judge(prompt)
            self.send(
                200,
                {
                    "id": f"judge-{stats.requests}",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                },
            )
            stats.add(t0, time.monotonic())

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the listen backlog: a trainer sends a whole batch at once
        daemon_threads = True

    return Server((host, port), Handler)


def main() -> None:
    """Serve until interrupted."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8008)
    ap.add_argument("--model", default="verifier-judge", help="the model name it answers to")
    ap.add_argument("--delay-s", type=float, default=0.0, help="added latency per request (to mimic a model)")
    args = ap.parse_args()
    server = make_server(args.host, args.port, args.model, args.delay_s)
    print(f"stand-in judge {args.model!r} on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
