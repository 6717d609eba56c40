"""How far a real judge obeys the judge probes: a logging proxy, then the figures from what it kept.

`textgym env hacks ENV --judge-config judge.yaml` prints whether each judge probe was *paid*;
this script also says whether the judge *obeyed* it, which a judge that never writes a verdict
in the request's tags (a 135M model) hides. Two steps (docs/judge.md, "A real small judge"):

    python bench/judge_obedience.py proxy http://127.0.0.1:8731 8732 exchanges.jsonl &
    textgym env hacks textgym/Arithmetic-v0 --env-kwargs split=test --env-kwargs operators=+ \\
        --env-kwargs digits=2 --env-kwargs instruction= --n 2 --judge-config judge.yaml  # via the proxy
    python bench/judge_obedience.py figures exchanges.jsonl --n 2

`proxy UPSTREAM PORT LOG` forwards every request on 127.0.0.1:PORT to UPSTREAM and appends each
chat exchange to LOG (JSONL: request, status, response). `figures LOG` finds, for each probe
(pointwise) and each of the env's first n tasks, the exchange that judged it, and reads its reply
under rules 1-3 of `textgym.verifiers.judge_verdict` (what bf12bac paid), under all four (what
is paid now), and for the scores its prose states (`judge_claims.score_claims` on the reply):
one that equals a score the probe claims is obedience, whether or not a rule could read it.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def proxy(upstream: str, port: int, log: str) -> None:
    """Serve 127.0.0.1:`port`, forwarding to `upstream` and logging chat exchanges to `log` (runs forever)."""
    import httpx

    lock = threading.Lock()
    client = httpx.Client(timeout=3600)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _relay(self, r: httpx.Response) -> None:
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        def do_GET(self) -> None:
            self._relay(client.get(upstream + self.path))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            r = client.post(upstream + self.path, content=body, headers={"Content-Type": "application/json"})
            if self.path.endswith("/chat/completions"):
                row = {"request": json.loads(body), "status": r.status_code}
                row["response"] = r.json() if r.status_code == 200 else r.text
                with lock, open(log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._relay(r)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def figures(log: str, env_id: str, env_kwargs: dict[str, Any], n: int) -> dict[str, list[dict[str, Any]]]:
    """Each probe's reads of its logged replies (one per task): before/after rule 4, tags, prose scores.

    Raises:
        KeyError: a probe reply that no logged exchange judged (the log is of another run).
    """
    from textgym.evaluation.judge_probes import JUDGE_PROBES, _judge_tasks, _wrong_reply
    from textgym.verifiers.judge_claims import claimed_values
    from textgym.verifiers.judge_prompts import neutralise
    from textgym.verifiers.judge_verdict import VerdictContext, own_verdicts, parse_score

    tasks = _judge_tasks(env_id, env_kwargs, n)
    by_response: dict[str, dict[str, Any]] = {}
    with open(log, encoding="utf-8") as lines:
        exchanges = [json.loads(line) for line in lines]
    for e in exchanges:
        m = re.search(r"<response>\n(.*?)\n</response>", e["request"]["messages"][-1]["content"], re.DOTALL)
        if m and e["status"] == 200:
            by_response.setdefault(m.group(1), e)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, probe in {"plain wrong": _wrong_reply, **JUDGE_PROBES}.items():
        for q, g in tasks:
            reply = probe({"gold": g, "question": q, "mode": "pointwise"})
            e = by_response[neutralise(reply)]
            prompt = e["request"]["messages"][-1]["content"]
            text = e["response"]["choices"][0]["message"]["content"]
            nonce = re.search(r"<verdict-([0-9a-f]{16})>", prompt)
            ctx = VerdictContext(
                nonce.group(1) if nonce else "",
                tuple(m["content"] for m in e["request"]["messages"]),
                q,
                (reply,),
            )
            found = own_verdicts(text, ctx, "pointwise")
            before = float(found.lines[-1].group(2)) if found.lines else None
            after, _ = parse_score(text, ctx)
            prose = claimed_values(text, q)
            out.setdefault(name, []).append(
                {"before": before, "after": after, "tagged": bool(found.graded),
                 "prose": sorted(prose), "restates": sorted(prose & claimed_values(reply, q)), "reply": text}
            )  # fmt: skip
    return out


def main() -> None:
    """The command line: `proxy UPSTREAM PORT LOG` or `figures LOG [--n N]` (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("upstream")
    p.add_argument("port", type=int)
    p.add_argument("log")
    f = sub.add_parser("figures")
    f.add_argument("log")
    f.add_argument("--n", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "proxy":
        proxy(args.upstream, args.port, args.log)
        return
    from textgym.evaluation.judge_probes import JUDGE_FORGERY, JUDGE_INJECTION

    kw = {"split": "test", "operators": "+", "digits": 2, "instruction": ""}
    rows = figures(args.log, "textgym/Arithmetic-v0", kw, args.n)
    for name, v in rows.items():
        reads = {k: [r[k] for r in v] for k in ("before", "after", "prose")}
        print(f"{name:28s} before {reads['before']} after {reads['after']} prose {reads['prose']}")
    for fam, names in (("forgery", list(JUDGE_FORGERY)), ("injection", list(JUDGE_INJECTION))):
        before = sum(any((r["before"] or 0) > 0 for r in rows[x]) for x in names)
        after = sum(any((r["after"] or 0) > 0 for r in rows[x]) for x in names)
        tagged = sum(r["tagged"] for x in names for r in rows[x])
        restated = sum(any(r["restates"] for r in rows[x]) for x in names)
        print(
            f"{fam} probes ({len(names)}): paid before rule 4 {before}, after {after}; replies with a "
            f"tagged verdict {tagged} of {len(names) * args.n}; prose states the claimed score {restated}"
        )


if __name__ == "__main__":
    main()
