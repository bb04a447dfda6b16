"""Duplicates in the training pool: the same prompt in other words (casing, punctuation,
spacing) and near-duplicates found by MinHash with locality-sensitive hashing.

Text is compared as its words (:func:`words`: Unicode NFKC, case-folded, runs of letters and
digits), so "Explain recursion!" and "explain  recursion" are one prompt
(:func:`exact_key`). A near-duplicate shares at least ``threshold`` of its shingles (the
5-byte windows of its words joined by spaces) with an earlier prompt: Jaccard similarity,
estimated by MinHash signatures of :data:`NUM_PERM` values and found through banded LSH
(:class:`NearDuplicates`; Broder 1997, Leskovec et al., *Mining of Massive Datasets* ch. 3),
each candidate pair then checked on its signatures. A row is compared by its last user turn,
and a row with earlier turns only with rows whose earlier turns are near-duplicates of its own
too: two turns of one conversation share their context but not their question, and are not
duplicates.

Own code rather than the ``datasketch`` package: its LSH imports SciPy (for one integral that
sizes the bands), which neither environment has; the MinHash here is the same construction
(universal hashing modulo the Mersenne prime 2^61 - 1) in numpy, about forty lines, with the
bands sized in closed form (:func:`bands_for`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

import numpy as np

from ..runtime.files import stable_hash

WORD = re.compile(r"\w+")
SHINGLE_BYTES = 5  # bytes of one shingle: a few characters, robust to a changed word
NUM_PERM = 128  # MinHash values per text
MERSENNE = np.uint64((1 << 61) - 1)
LOW32 = np.uint64((1 << 32) - 1)
# the smallest chance that a pair at the threshold shares a band (becomes a candidate)
RECALL = 0.99
SEED = 1  # the permutations: fixed, so a pool's near-duplicates are the same on every run


def words(text: str) -> list[str]:
    """The words of ``text``: NFKC-normalized, case-folded runs of letters and digits."""
    return WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def normalized(text: str) -> str:
    return " ".join(words(text))


def exact_key(messages: list[dict]) -> str:
    """Digest of the messages' roles and words: equal for prompts that differ only in casing,
    punctuation and spacing."""
    return stable_hash([[m["role"], normalized(m["content"])] for m in messages])


def shingles(text: str) -> np.ndarray:
    """The distinct 5-byte windows of ``text`` (normalized UTF-8) as integers; a text shorter
    than a window is one shingle."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint64)
    if len(data) < SHINGLE_BYTES:
        data = np.concatenate([data, np.zeros(SHINGLE_BYTES - len(data), np.uint64)])
    windows = np.lib.stride_tricks.sliding_window_view(data, SHINGLE_BYTES)
    values = (windows << (np.arange(SHINGLE_BYTES, dtype=np.uint64) * np.uint64(8))).sum(axis=1)
    return np.unique(values)


class MinHasher:
    """MinHash signatures: for each of ``num_perm`` hash functions h(x) = (a x + b) mod p, the
    least value over a text's shingles (the shingle mixed to 32 bits first)."""

    def __init__(self, num_perm: int = NUM_PERM, seed: int = SEED):
        rng = np.random.RandomState(seed)
        self.a = rng.randint(1, int(MERSENNE), size=num_perm, dtype=np.uint64)
        self.b = rng.randint(0, int(MERSENNE), size=num_perm, dtype=np.uint64)

    def signature(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as datasketch's does
            mixed = (values * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
            hashed = ((mixed[:, None] * self.a + self.b) % MERSENNE) & LOW32
        return hashed.min(axis=0).astype(np.uint32)


def bands_for(threshold: float, num_perm: int = NUM_PERM) -> tuple[int, int]:
    """(bands, rows per band): the most rows per band (fewest false candidates) that still
    makes a pair of similarity ``threshold`` a candidate with probability :data:`RECALL`."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1 - (1 - threshold**rows) ** bands >= RECALL:
            best = (bands, rows)
    return best


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity estimated from two signatures."""
    return float(np.count_nonzero(a == b)) / len(a)


def row_texts(messages: list[dict]) -> tuple[str, str]:
    """(last user turn, the messages before it) of a row, normalized."""
    last = normalized(messages[-1]["content"])
    context = " | ".join(f"{m['role']}: {normalized(m['content'])}" for m in messages[:-1])
    return last, context


class NearDuplicates:
    """Rows seen so far; :meth:`check` says whether a row is a near-duplicate of one of them,
    and remembers it when it is not."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.hasher = MinHasher()
        self.bands, self.rows = bands_for(threshold)
        self.buckets: list[dict[bytes, list[int]]] = [{} for _ in range(self.bands)]
        self.signatures: list[np.ndarray] = []
        self.contexts: list[np.ndarray | None] = []
        self.ids: list[str] = []

    def _signature(self, text: str) -> np.ndarray:
        return self.hasher.signature(shingles(text))

    def check(self, row_id: str, messages: list[dict]) -> tuple[str, float] | None:
        """(id of the earlier row, estimated similarity) when the row is a near-duplicate of
        one seen before, else None (and the row is remembered)."""
        last, context = row_texts(messages)
        sig = self._signature(last)
        ctx = self._signature(context) if context else None
        keys = [sig[i * self.rows : (i + 1) * self.rows].tobytes() for i in range(self.bands)]
        candidates = sorted(
            {j for band, key in enumerate(keys) for j in self.buckets[band].get(key, ())}
        )
        for j in candidates:
            sim = similarity(sig, self.signatures[j])
            if sim < self.threshold:
                continue
            other = self.contexts[j]
            if (ctx is None) != (other is None):
                continue
            if ctx is not None and similarity(ctx, other) < self.threshold:
                continue
            return self.ids[j], sim
        index = len(self.signatures)
        self.signatures.append(sig)
        self.contexts.append(ctx)
        self.ids.append(row_id)
        for band, key in enumerate(keys):
            self.buckets[band].setdefault(key, []).append(index)
        return None


def first_of_each(rows: Iterable[dict], threshold: float) -> Iterable[tuple[dict, str, float]]:
    """For each row (in order) that is a near-duplicate of an earlier one: the row, the earlier
    row's id and their estimated similarity."""
    index = NearDuplicates(threshold)
    for row in rows:
        found = index.check(row["id"], row["messages"])
        if found:
            yield row, found[0], found[1]
