"""Rule names given on the command line (``--until``, ``--omit-from``, ``-R``): Snakemake takes
a name that is no rule for a file it cannot make ("No rule to produce prompts"), and ``--until
extract`` in a mode without extract jobs for a DAG of nothing; both are refused here, with the
rules that exist.

Snakemake hands the workflow these options only after it has read the Snakefile, so the
workflow reads them from the command line itself (:func:`rule_options`), as Snakemake's own
parser does.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from pathlib import Path

from .values import extracts_in_train

# the rules that exist in stored mode only (online and hybrid: the train jobs extract)
STORED_RULES = ("extract", "extract_gather")


def rule_options(argv: list[str]) -> dict[str, list[str]]:
    """The names given to --until (-U), --omit-from (-O) and --forcerun (-R) in ``argv`` (a
    snakemake command line without the program), each option as Snakemake's parser takes it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--until", "-U", nargs="+", action="extend", default=[])
    parser.add_argument("--omit-from", "-O", nargs="+", action="extend", default=[])
    parser.add_argument("--forcerun", "-R", nargs="*", action="extend", default=[])
    known, _ = parser.parse_known_args(argv)
    return {"--until": known.until, "--omit-from": known.omit_from, "-R": known.forcerun}


def command_line_problems(
    given: dict[str, Iterable[str]], rules: list[str], cfg: dict
) -> list[str]:
    """A line for every name of ``given`` (option -> its values) that is neither a rule of
    ``rules`` nor a file (a path, or one that exists), and for a stored-mode rule named in a
    mode without one."""
    problems = []
    for option, values in given.items():
        for name in sorted(values or ()):
            if name in STORED_RULES and extracts_in_train(cfg):
                problems.append(
                    f"{option} {name}: with extract.mode {cfg['extract']['mode']} there is no "
                    f"{name} job (each train job extracts the hidden states it trains on); "
                    "stop after the data with --until vocab (prepare runs before it), or at "
                    "--until train"
                )
            elif name not in rules and "/" not in name and not Path(name).exists():
                near = [r for r in rules if r.startswith(f"{name}_")]
                near = near or difflib.get_close_matches(name, rules, n=2)
                guess = f" (did you mean {' or '.join(near)}?)" if near else ""
                problems.append(
                    f"{option} {name}: no rule of that name{guess}; the rules: "
                    f"{', '.join(r for r in rules if r != 'all')}"
                )
    return problems
