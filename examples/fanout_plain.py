"""A three-branch fan-out with one conditional route, in plain Python, emitting to a file.

Run: ``.venv/bin/python examples/fanout_plain.py out.jsonl`` then
``.venv/bin/fanin run --input out.jsonl --output out/plain``.
"""

from __future__ import annotations

import sys

from fanin.sdk import Emitter, JoinContext, JsonlFileSink


def answer(question: str, emitter: Emitter) -> None:
    ctx = JoinContext.new(run_id="demo")
    # retrieve and rank always run; exactly one of review/legal, review/tech runs
    emitter.open(ctx, required=["retrieve", "rank", "review/legal", "review/tech"],
                 deadline_s=30)

    @emitter.branch(ctx, "retrieve", key="docs")
    def retrieve() -> list[str]:
        return [f"doc about {question}"]

    @emitter.branch(ctx, "rank", key="score")
    def rank() -> float:
        return 0.9

    retrieve()
    rank()
    if "contract" in question:  # the conditional route
        with emitter.receipt(ctx, "review/legal") as r:
            r.value = "clause 4 is fine"
        emitter.skip(ctx, "review/tech")  # the route not taken: prunes it, nothing hangs
    else:
        with emitter.receipt(ctx, "review/tech") as r:
            r.value = "code looks fine"
        emitter.skip(ctx, "review/legal")


def main(path: str) -> None:
    with JsonlFileSink(path) as sink:
        emitter = Emitter(sink)
        for question in ("review this contract", "review this patch"):
            answer(question, emitter)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: python {sys.argv[0]} OUT.jsonl", file=sys.stderr)
        raise SystemExit(2)
    main(sys.argv[1])
