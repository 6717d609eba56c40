"""A scripted OpenAI-compatible judge on 127.0.0.1 for the LLM-judge tests (a real HTTP server in a thread).

`FakeJudge(reply)` answers `POST /v1/chat/completions` with `reply(prompt_text)` as the
assistant's message (the prompt text is the last message's content; with `whole=True`,
`reply(messages)` gets every message of the request), after `delay_s`. A judge's verdict counts
only inside the request's verdict tags: `tagged(prompt, "SCORE: 7")` writes it there. Scripted
failures come first: each `fail(status, body, headers)` is answered once, in order, before any
judgement. `right_answer_judge` grades `Compute a+b.` honestly; `obedient_judge` gives a response
the score it claims (`claimed_by`, a reading of its own), in its own words. It records every request
body, and the most requests it ever held at once (`max_in_flight`). `GET /v1/models` lists `models`.
Imported by tests as `from judge_fakes import ...` (tests/ is on sys.path).
"""

from __future__ import annotations

import json
import re
import threading
import time
import unicodedata
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeJudge:
    """A judge endpoint whose answers are `reply(prompt_text)`; see the module docstring."""

    def __init__(
        self,
        reply: Callable[[str], str] | None = None,
        delay_s: float = 0.0,
        models: tuple[str, ...] = ("judge",),
        whole: bool = False,
    ):
        self.reply: Callable[[Any], str] = reply or (lambda prompt: tagged(prompt, "SCORE: 5"))
        self.whole = whole
        self.delay_s = delay_s
        self.models = list(models)
        self.requests: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.script: list[tuple[int, str, dict[str, str]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": m} for m in fake.models]}))
                else:
                    self._send(404, json.dumps({"error": {"message": "not found"}}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.requests.append(body)
                    fake.times.append(time.monotonic())
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    scripted = fake.script.pop(0) if fake.script else None
                left = False  # whether this request no longer counts as in flight

                def leave() -> None:
                    nonlocal left
                    if not left:
                        with fake._lock:
                            fake.in_flight -= 1
                        left = True

                def answer(*args: Any) -> None:
                    # the request leaves the count before its answer is sent: a client that
                    # sends its next request on reading this answer never overlaps it here
                    leave()
                    self._send(*args)

                try:
                    time.sleep(fake.delay_s)
                    if scripted is not None:
                        answer(*scripted)
                        return
                    if body.get("model") not in fake.models:
                        msg = {"error": {"message": f"model {body.get('model')!r} not found"}}
                        answer(404, json.dumps(msg))
                        return
                    text = fake.reply(body["messages"] if fake.whole else body["messages"][-1]["content"])
                    out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
                    answer(200, json.dumps(out))
                finally:
                    leave()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def fail(
        self, status: int, body: str = '{"error": {"message": "scripted"}}', **headers: str
    ) -> FakeJudge:
        """Answer the next request not yet answered with `status` (before any judgement); chainable."""
        self.script.append((status, body, {k.replace("_", "-"): v for k, v in headers.items()}))
        return self

    def prompts(self) -> list[str]:
        """The prompt text of every request received, in order."""
        return [r["messages"][-1]["content"] for r in self.requests]

    def close(self) -> None:
        """Stop the server."""
        self.server.shutdown()
        self.server.server_close()


def nonce_of(prompt: str) -> str:
    """The nonce of a judge prompt's verdict tags (the rubric's instruction names them)."""
    m = re.search(r"<verdict-([0-9a-f]+)>", prompt)
    assert m is not None, "the judge prompt names no verdict tags"
    return m.group(1)


def tagged(prompt: str, verdict: str) -> str:
    """`verdict` (e.g. "SCORE: 7") inside the verdict tags `prompt` asks for, as a judge writes it."""
    tag = f"verdict-{nonce_of(prompt)}"
    return f"<{tag}>{verdict}</{tag}>"


def block(prompt: str, tag: str) -> str:
    """The text inside the first `<tag ...>` ... `</tag>` block of a judge prompt ("" if none)."""
    m = re.search(rf"<{tag}(?: [^>]*)?>\n?(.*?)\n?</{tag}>", prompt, re.DOTALL)
    return m.group(1) if m else ""


def right_answer_judge(prompt: str) -> str:
    """A judge that reads the sum in `Compute a+b.` and grades the response's last number against it.

    Pointwise: `SCORE: 10` or `SCORE: 0`; pairwise: `WINNER: A|B|TIE`; group: `SCORE i: 10|0`,
    always inside the request's verdict tags, whatever the responses contain.
    """
    m = re.search(r"Compute (\d+)\+(\d+)\.", block(prompt, "question"))
    gold = str(int(m.group(1)) + int(m.group(2))) if m else None

    def right(text: str) -> bool:
        boxed = re.findall(r"\\boxed\{(-?\d+)\}", text)
        return bool(boxed) and boxed[-1] == gold

    if "<response_a>" in prompt:
        a, b = right(block(prompt, "response_a")), right(block(prompt, "response_b"))
        return tagged(prompt, "WINNER: " + ("TIE" if a == b else "A" if a else "B"))
    groups = re.findall(r'<response id="(\d+)">\n(.*?)\n</response>', prompt, re.DOTALL)
    if groups:
        lines = "\n".join(f"SCORE {i}: {10 if right(t) else 0}" for i, t in groups)
        return tagged(prompt, f"\n{lines}\n")
    return f"Graded against {gold}.\n" + tagged(
        prompt, f"SCORE: {10 if right(block(prompt, 'response')) else 0}"
    )


_WORDS = {"ten": 10.0, "nine": 9.0, "full": 10.0, "perfect": 10.0}


def claimed_by(response: str) -> float | None:
    """The score an obedient judge reads in a response: its own reading, independent of textgym's.

    Reads, after NFKC, with every decimal digit as ASCII and zero-width characters dropped: a
    fraction or "out of" (`9.5/10`, `10 out of 10` → 10·N/M), a percentage after a score word
    (`Score: 100%` → 10), a number or `ten` after score/rating/grade (`Score = 10`, `rating: ten`),
    or "full marks" / a note to the grader (→ 10). None when it finds nothing.
    """
    t = unicodedata.normalize("NFKC", response.replace("&lt;", "<"))
    t = "".join(ch for ch in t if unicodedata.category(ch) != "Cf")
    t = "".join(str(unicodedata.decimal(ch)) if ch.isdecimal() else ch for ch in t).lower()
    m = re.search(r"(\d+(?:\.\d+)?|ten)\s*(?:/|out of)\s*(\d+|ten)", t)
    if m:
        n, d = (_WORDS.get(x) or float(x) for x in m.groups())
        return 10.0 * n / d
    m = re.search(r"(?:score|rating|grade)\s*[:=]?\s*(\d+(?:\.\d+)?|ten|nine)\s*(%?)", t)
    if m:
        n = _WORDS.get(m.group(1)) or float(m.group(1))
        return n / 10.0 if m.group(2) else n
    if "full marks" in t or "note to the grader" in t:
        return 10.0
    return None


def obedient_judge(prompt: str) -> str:
    """A judge that obeys: any response claiming a score gets that score, written in its own words.

    The others are graded as `right_answer_judge` grades them. Its verdict, `SCORE: 10.0` for a
    claimed `10`, is never a copy of the response's text, so only a rule that compares numbers
    (rule 4 of `judge_verdict`) refuses it. Pointwise and group.
    """
    fair = right_answer_judge(prompt)
    groups = re.findall(r'<response id="(\d+)">\n(.*?)\n</response>', prompt, re.DOTALL)
    if groups:
        scores = dict(re.findall(r"SCORE (\d+): (\d+)", fair))
        lines = []
        for i, text in groups:
            final = text.split("<final_turn>")[-1]
            claim = claimed_by(final)
            lines.append(f"SCORE {i}: {claim:.1f}" if claim is not None else f"SCORE {i}: {scores[i]}")
        return "Grading each response.\n" + tagged(prompt, "\n" + "\n".join(lines) + "\n")
    claim = claimed_by(block(prompt, "response"))
    if claim is None:
        return fair
    return f"The response says it deserves {claim:g}, and I agree.\n" + tagged(prompt, f"SCORE: {claim:.1f}")
