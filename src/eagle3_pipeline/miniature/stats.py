"""How varied and how well-formed the miniature's answers are.

Per answer (the completion ids the model wrote after the generation prompt, which opened
``<think>``): ``distinct`` = distinct ids / ids, ``distinct_2`` = distinct bigrams / bigrams,
``top_share`` = the most frequent id's share, whether ``</think>`` appears (the reasoning parser
then splits the answer) and whether the turn ended (``<|im_end|>`` or [EOS]). Over answers:
the means, the fractions, and how many answers are distinct from each other. A model that
repeats one token has distinct near 0 and top_share near 1; one that ignores the prompt gives
the same answer everywhere.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from .tokenizer import TOKEN_IDS

THINK_END = TOKEN_IDS["</think>"]
ENDS = (TOKEN_IDS["<|im_end|>"], TOKEN_IDS["[EOS]"])


def answer_stats(ids: list[int]) -> dict:
    n = len(ids)
    body = [i for i in ids if i not in ENDS]
    bigrams = list(pairwise(body))
    counts = Counter(body)
    return {
        "tokens": n,
        "distinct": len(counts) / max(1, len(body)),
        "distinct_2": len(set(bigrams)) / max(1, len(bigrams)),
        "top_share": (counts.most_common(1)[0][1] / len(body)) if body else 1.0,
        "think_end": THINK_END in ids,
        "reasoning_tokens": ids.index(THINK_END) if THINK_END in ids else n,
        "ended": bool(ids) and ids[-1] in ENDS,
    }


def summary(answers: list[list[int]]) -> dict:
    per = [answer_stats(a) for a in answers]
    k = max(1, len(per))

    def mean(key):
        return round(sum(float(p[key]) for p in per) / k, 4)

    return {
        "answers": len(per),
        "mean_tokens": mean("tokens"),
        "mean_distinct": mean("distinct"),
        "mean_distinct_2": mean("distinct_2"),
        "mean_top_share": mean("top_share"),
        "think_end_fraction": mean("think_end"),
        "ended_fraction": mean("ended"),
        "mean_reasoning_tokens": mean("reasoning_tokens"),
        "distinct_answers": len({tuple(a) for a in answers}),
    }
