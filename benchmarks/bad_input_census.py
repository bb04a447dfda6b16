"""How many bad inputs the bad-input suite tries, and what each got.

    .venv/bin/python benchmarks/bad_input_census.py \
        [--examples 150] [--out benchmarks/results/checks/bad_input.json]

Runs tests/test_bad_input.py (a test for each hand-made probe: bad config keys and files, model
directories, prompt files, command lines, shared-machine hazards) and
tests/test_bad_input_generated.py (hypothesis, derandomized: --examples malformed prompt files,
configs with wrong values and damaged config files each), and records the tests that passed
and each generated case's outcome: refused with an error naming the key or file, read with its
bad rows skipped and counted, or valid and accepted. Any other ending fails a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle3_lab.results import write_result

REPO = Path(__file__).resolve().parents[1]
SUITES = ("tests/test_bad_input.py", "tests/test_bad_input_generated.py")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=150, help="generated cases per kind")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/checks/bad_input.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tally = Path(tmp) / "tally.json"
        env = {
            **os.environ,
            "EAGLE3_BAD_INPUT_TALLY": str(tally),
            "EAGLE3_BAD_INPUT_EXAMPLES": str(args.examples),
        }
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES]
        t0 = time.monotonic()
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = round(time.monotonic() - t0, 1)
        print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n")
        if proc.returncode != 0:
            return proc.returncode
        outcomes = json.loads(tally.read_text())
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    result = {
        "command": "benchmarks/bad_input_census.py --examples " + str(args.examples),
        "suites": list(SUITES),
        "tests_passed": passed,
        "generated_cases": sum(outcomes.values()),
        "outcomes": outcomes,
        "seconds": seconds,
        "machine": f"{os.cpu_count()} CPU cores, shared",
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
