"""Both models over the same texts, teacher-forced: the target and every draft evaluate
``prompt + text`` in batched decodes of ``chunk`` tokens with logits at each of them, in
lockstep, so that at most two chunks of logits per model are held (64 rows × 152k
vocabulary × 4 B = 39 MB), never a context's worth. The prompt is evaluated without logits,
and what a text shares with the one before (the chat template's preamble) is kept in the
cache, as ``calibrate`` does. The figures of each chunk are taken at once
(``predict.position_rows``) and the logits dropped.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..calibrate import prefill
from ..engine import rules
from ..llamacpp.runtime import Part
from .corpus import Item
from .predict import Rows, TargetRows, position_rows

DEFAULT_CHUNK = 64

Progress = Callable[[int, int, int, int], None]  # (texts done, texts, positions done, positions)


@dataclass(frozen=True)
class Settings:
    temperature: float  # of α's p and q (0: α is the greedy agreement)
    top_k: int
    top_p: float
    top_n: int  # of the EASD gate's overlap


@dataclass
class Scored:
    """Per scored text: one ``Rows`` per draft, and whether the target's argmax is the text's
    token (1 along the target's own greedy text, up to llama.cpp's batched numerics)."""

    item: Item
    drafts: list[Rows]
    target_is_text: np.ndarray


@dataclass
class Pass:
    scored: list[Scored] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)  # (label, tokens): longer than the context
    seconds: float = 0.0
    seconds_target: float = 0.0
    seconds_drafts: list[float] = field(default_factory=list)

    @property
    def positions(self) -> int:
        return sum(len(s.item.text) for s in self.scored)

    def rows(self, d: int, labels: set[str] | None = None) -> Rows:
        """Draft ``d``'s figures over every scored text (or those labelled ``labels``), in order."""
        parts = [s.drafts[d] for s in self.scored if labels is None or s.item.label in labels]
        return Rows(*(np.concatenate([getattr(r, f) for r in parts]) if parts else np.zeros(0)
                      for f in ("agree", "alpha", "kl", "h_draft", "h_target", "overlap")))


def _decode_rows(model, tokens: Sequence[int]) -> np.ndarray:
    return model.decode_batch([Part(0, list(tokens), range(len(tokens)))])[0]


def run(target, drafts: Sequence, items: Sequence[Item], settings: Settings, *, chunk: int = DEFAULT_CHUNK,
        progress: Progress | None = None) -> Pass:
    """Score ``items`` with ``target`` and each of ``drafts`` (loaded models, sequence 0 of
    each context is used). An item longer than the smallest context is skipped and listed."""
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    models = [target, *drafts]
    ctx = min(m.n_ctx for m in models)
    shared = [min(target.n_vocab, d.n_vocab) for d in drafts]
    out = Pass(seconds_drafts=[0.0] * len(drafts))
    t0 = time.perf_counter()
    total = sum(len(it.text) for it in items)
    done = 0

    def figures(z_t: np.ndarray, z_ds: list[np.ndarray], text: np.ndarray) -> tuple[np.ndarray, list[Rows]]:
        sides = {V: TargetRows(z_t[:, :V], settings.top_n) for V in set(shared)}  # once per vocabulary size
        rows = [position_rows(sides[V], z_d[:, :V], temperature=settings.temperature, top_k=settings.top_k,
                              top_p=settings.top_p) for z_d, V in zip(z_ds, shared)]
        return rules.greedy(z_t) == text, rows

    # the figures of a chunk are taken in a second thread while the models decode the next
    # (llama.cpp and numpy both release the GIL): one chunk in flight, so at most two chunks
    # of logits are held
    with ThreadPoolExecutor(max_workers=1) as worker:
        for n_item, it in enumerate(items, 1):
            start = len(it.prompt) - 1  # seq[start + j] is evaluated to predict text[j]
            seq = list(it.prompt) + list(it.text)
            n = len(it.text)
            if start + n > ctx or not it.prompt:
                out.skipped.append((it.label, len(seq)))
                total -= n
                continue
            for m in models:
                prefill(m, seq[:start])
            parts: list[list[Rows]] = [[] for _ in drafts]
            is_text: list[np.ndarray] = []
            pending: Future | None = None

            def collect(f: Future) -> None:
                txt, rows = f.result()
                is_text.append(txt)
                for k, r in enumerate(rows):
                    parts[k].append(r)

            for c0 in range(0, n, chunk):
                toks = seq[start + c0 : start + min(c0 + chunk, n)]
                ts = time.perf_counter()
                z_t = _decode_rows(target, toks)
                out.seconds_target += time.perf_counter() - ts
                z_ds = []
                for k, d in enumerate(drafts):
                    ts = time.perf_counter()
                    z_ds.append(_decode_rows(d, toks))
                    out.seconds_drafts[k] += time.perf_counter() - ts
                if pending is not None:
                    collect(pending)
                pending = worker.submit(figures, z_t, z_ds, np.asarray(it.text[c0 : c0 + len(toks)]))
                done += len(toks)
                if progress is not None:
                    progress(n_item - 1, len(items), done, total)
            if pending is not None:
                collect(pending)
            joined = [Rows(*(np.concatenate([getattr(r, f) for r in ps])
                             for f in ("agree", "alpha", "kl", "h_draft", "h_target", "overlap"))) for ps in parts]
            out.scored.append(Scored(it, joined, np.concatenate(is_text)))
            if progress is not None:
                progress(n_item, len(items), done, total)
    out.seconds = time.perf_counter() - t0
    return out
