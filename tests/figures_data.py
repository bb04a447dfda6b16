"""The figures of docs/data.md: prompts the packaged model writes itself on the CPU and what the
pool's cleaning removes from the packaged chat sources (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "docs/data.md"
WRITTEN = "data/self_written_cpu.json"
FIRST = "data/pool_cleaning.json"
EACH = "data/pool_cleaning_each_turn.json"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


def row(pool: str, source: str, alias: str) -> str:
    s = f"{alias}.sources.{source}"
    repeats = "–" if source == "sharegpt" else f"{{{s}.duplicates_across_sources|,}}"
    return (
        f"| {pool} | {source} | {{{s}.sampled|,}} | {repeats} | {{{s}.near_duplicates|,}} | "
        f"{{sum({s}.decontaminated.value.values())}} | {{{s}.in_pool|,}} |"
    )


CLAIMS = [
    c(
        WRITTEN,
        "wrote {f.requests} user turns in {f.wall_s|.0f} s once its server was up: "
        "{f.requests_per_min|.0f} write requests and {f.turns_kept_per_min|.0f} kept turns per "
        "minute, {f.completion_tokens_per_s|.0f} completion tokens/s",
    ),
    c(
        WRITTEN,
        "The filters kept {f.written.turns_kept} of {f.written.turns_written} "
        "({f.kept_fraction|.0%}); the {f.written.removed.unfinished} removed all ran on to the "
        "{f.settings.max_tokens}-token limit (`unfinished`)",
    ),
    c(
        WRITTEN,
        "Kept turns are {f.written.chars.p50|.0f} characters at the median (p90 "
        "{f.written.chars.p90|.0f}).",
    ),
    c(
        WRITTEN,
        "Beside {f.pool.sources.sharegpt.in_pool} ShareGPT prompts in the pool none of the "
        "{f.pool.sources.written.in_pool} was a near-duplicate or a benchmark prompt.",
    ),
    c({"a": FIRST, "b": EACH}, row("first turns", "sharegpt", "a")),
    c({"a": FIRST, "b": EACH}, row("first turns", "chitchat", "a")),
    c({"a": FIRST, "b": EACH}, row("every user turn", "sharegpt", "b")),
    c({"a": FIRST, "b": EACH}, row("every user turn", "chitchat", "b")),
    c(
        {"a": FIRST, "b": EACH},
        "chitchat's 7,168 conversations have {a.sources.chitchat.duplicates|,} exact repeats "
        "among their first turns already",
    ),
    c(
        {"a": FIRST, "b": EACH},
        "Cleaning the {b.totals.sampled|,} every-turn prompts took {b.seconds|.0f} s of wall "
        "time on the shared machine; the first turns, {a.seconds|.0f} s.",
    ),
]
