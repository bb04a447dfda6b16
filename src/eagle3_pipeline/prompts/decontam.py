"""Decontamination: training prompts that contain a benchmark prompt are not trained on.

A training row is contaminated by a benchmark set when one of its messages (any role: an
answer in a conversation's context is trained on as much as its questions)

- has the same words as a benchmark prompt's turn (``exact``: casing, punctuation and spacing
  aside, :func:`.dedup.words`);
- shares a run of ``ngram`` words with one (``ngram``; 13 words, as GPT-3 and most reports
  since decontaminate: long enough that common phrases do not match, short enough that an
  edited copy does);
- contains the whole of one that is shorter than ``ngram`` words but has at least
  :data:`MIN_CONTAINED_WORDS` (``contained``: a short question pasted into a longer prompt).

A benchmark prompt's turns are its user and system messages and its later turns (MT-Bench's
second questions), every turn of every row of the benchmark's source, not only the rows a set
samples: the pool stays clean for a set that samples more of the same source later.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .dedup import words
from .selection import filter_rows
from .sources import read_source, source_name

# A benchmark turn shorter than the n-gram counts when contained whole from this many words
# on: below it, phrases ("what is the capital of france") would match unrelated prompts.
MIN_CONTAINED_WORDS = 8
BENCH_ROLES = ("system", "user")


@dataclass
class Match:
    """Why a training row is contaminated: the benchmark source, how, and the matching text."""

    against: str
    how: str  # exact, ngram, contained
    text: str


@dataclass
class BenchIndex:
    """The turns of the benchmark prompts, indexed for :meth:`match`."""

    ngram: int | None
    exact: dict[str, str] = field(default_factory=dict)  # normalized turn -> benchmark
    grams: dict[tuple[str, ...], str] = field(default_factory=dict)
    short: dict[int, dict[tuple[str, ...], str]] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)  # per benchmark: turns indexed

    def add(self, against: str, text: str) -> None:
        w = words(text)
        if not w:
            return
        self.turns[against] = self.turns.get(against, 0) + 1
        self.exact.setdefault(" ".join(w), against)
        n = self.ngram
        if n is None:
            return
        if len(w) >= n:
            for gram in zip(*(w[i:] for i in range(n)), strict=False):
                self.grams.setdefault(gram, against)
        elif len(w) >= MIN_CONTAINED_WORDS:
            self.short.setdefault(len(w), {}).setdefault(tuple(w), against)

    def add_rows(self, against: str, rows: list[dict]) -> None:
        """Every turn of benchmark ``rows`` (prompt rows), under the name ``against``."""
        for row in rows:
            for m in row["messages"]:
                if m["role"] in BENCH_ROLES:
                    self.add(against, m["content"])
            for turn in row.get("later_turns", ()):
                self.add(against, turn)

    def match(self, messages: list[dict]) -> Match | None:
        """The first way one of ``messages`` contains a benchmark turn, or None."""
        for m in messages:
            w = words(m["content"])
            if not w:
                continue
            text = " ".join(w)
            if text in self.exact:
                return Match(self.exact[text], "exact", text)
            n = self.ngram
            if n is None:
                continue
            if self.grams and len(w) >= n:
                for gram in zip(*(w[i:] for i in range(n)), strict=False):
                    if gram in self.grams:
                        return Match(self.grams[gram], "ngram", " ".join(gram))
            for length, turns in self.short.items():
                if len(w) <= length:
                    continue
                for window in zip(*(w[i:] for i in range(length)), strict=False):
                    if window in turns:
                        return Match(turns[window], "contained", " ".join(window))
        return None


def bench_index(sources: list[dict], ngram: int | None) -> BenchIndex:
    """Every turn of every row of each benchmark source (``{"source", "path"}``, as
    :func:`eagle3_pipeline.config.decontamination_sources` lists them), named as a set of that
    source would be by default."""
    index = BenchIndex(ngram)
    for spec in sources:
        name = source_name(spec)
        raws, _ = read_source(spec)
        rows, _ = filter_rows(
            spec["source"], raws, name, sys.maxsize, multi_turn=True, max_turns=sys.maxsize
        )
        index.add_rows(name, rows)
    return index
