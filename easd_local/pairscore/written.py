"""The target writes first: its greedy answers to a dataset's questions, generated here with
the target alone (the fastest mode on a CPU), become the corpus. Along the target's own greedy
text the simulation of greedy SD is exact, as with ``--from RESULTS.jsonl``, without a bench
file: a new pair's faithful score costs one target-only generation and one pass."""

from __future__ import annotations

import time
from typing import Callable

from ..bench.prompt import build_messages
from ..engine.config import DecodeConfig
from ..engine.decoding import fits_context, generate_all
from .corpus import WRITTEN, Corpus, Item, Source

Progress = Callable[[int, int, int], None]  # (answers done, answers, tokens written)


def target_writes(target, src: Source, *, progress: Progress | None = None) -> Corpus:
    """Generate ``src``'s answers with ``target`` (a loaded Model; greedy, ``src.max_tokens``
    each, the chat prompt bench uses) and return them as the corpus. A question whose prompt
    does not fit the context is left out and named in the notes."""
    cfg = DecodeConfig(mode="target", temperature=0.0, max_tokens=src.max_tokens)
    cfg.validate(target.n_vocab)
    items: list[Item] = []
    too_long: list[str] = []
    tokens, t0 = 0, time.perf_counter()
    for k, prob in enumerate(src.problems, 1):
        prompt = target.vocab.chat_tokens(build_messages(prob.question))
        if not fits_context(len(prompt), target.n_ctx):
            too_long.append(prob.qid)
        else:
            # a fresh cache for each answer, as bench's rows have (reuse_cache=False): the
            # prompt is evaluated in the same batches, so the answers are bench's target rows
            target.reset_seq(0)
            fin, _ = generate_all(target, None, prompt, cfg)
            items.append(Item(prob.qid, prompt, list(fin.tokens), src.max_tokens))
            tokens += len(fin.tokens)
        if progress is not None:
            progress(k, len(src.problems), tokens)
    seconds = time.perf_counter() - t0
    notes = [f"the target wrote these {len(items)} answers here first (greedy, at most {src.max_tokens} tokens each): "
             f"{tokens:,} tokens in {seconds:.0f} s; along them greedy SD is simulated as it runs"]
    if too_long:
        notes.append(f"{len(too_long)} question{'s' if len(too_long) != 1 else ''} left out: the prompt does not fit "
                     f"the {target.n_ctx}-token context ({', '.join(too_long[:3])}{', ...' if len(too_long) > 3 else ''})")
    return Corpus(WRITTEN, f"{len(items)} {src.name} answers the target wrote here", items, notes)
