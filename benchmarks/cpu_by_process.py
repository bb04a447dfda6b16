"""Where a command's CPU time goes, by kind of process (vLLM engine cores and API servers,
trainings, Snakemake job scripts and dry runs, the pytest sessions, Slurm's daemons, ...), and
how much of the machine stood idle minute by minute: what the full test tier spends its two
cores on.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/cpu_by_process.py \\
        --out benchmarks/results/tests/cpu_by_process_full.json -- .ci/run --basetemp=/tmp/ci

/proc is read every --interval seconds: each process's CPU time (user + system) from when it
was first seen to when it was last seen (a process older than the command counts only what it
spent meanwhile), its kind from its latest command line. A process that lives less than one
interval is missed and what the last interval of each process spent is lost, so the sum by
kind is a lower bound; the machine's busy and idle time (/proc/stat) is exact. Sampling costs
about 1% of one core.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from eagle3_lab.results import write_result

TICK = os.sysconf("SC_CLK_TCK")
# (kind, pattern in the command line, or in the process name for renamed processes); the first
# that matches names a process
KINDS = (
    ("vLLM engine core", r"EngineCor"),  # (a process name keeps 15 characters)
    ("vLLM API server", r"vllm\.entrypoints"),
    ("vLLM model-class probe", r"vllm\.model_executor\.models\.registry"),
    ("training", r"eagle3_pipeline\.train\.entry|torch\.distributed\.run"),
    ("Snakemake job script", r"\.snakemake/scripts/"),
    ("Snakemake dry run", r"snakemake .*(?: -n(?: |$)|--dry-run)"),
    ("Snakemake", r"snakemake"),
    ("pytest, side lane", r"pytest .*side_lane"),
    ("pytest", r"pytest"),
    ("Slurm and munge", r"slurm|munge"),
    ("pip", r"-m pip"),
    ("the miniature's build", r"miniature_build"),
)


def kind_of(cmdline: str, name: str) -> str:
    if not cmdline.strip():
        return "kernel threads"
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline) or re.search(pattern, name):
            return kind
    return "other"


def read_stat(pid: str) -> tuple[float, int] | None:
    """(CPU seconds, start in clock ticks since boot), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def machine_ticks() -> tuple[int, int]:
    """(busy, idle) clock ticks of every core since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:8]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, idle


def sample(processes: dict, now: float) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        stat = read_stat(pid)
        if stat is None:
            continue
        cpu, start = stat
        seen = processes.setdefault((int(pid), start), {"first_s": now, "cpu_at_first": cpu})
        seen.update(cpu=cpu, last_s=now)
        # the latest command line: a spawned process shows its parent's until it renames itself
        seen["cmdline"] = read_text(f"/proc/{pid}/cmdline")[:300] or seen.get("cmdline", "")
        seen["name"] = read_text(f"/proc/{pid}/comm")


def summarize(processes: dict, ticks: list, t0: float, cores: int) -> dict:
    by_kind: dict[str, dict] = {}
    rows = []
    for (pid, _), p in processes.items():
        spent = p["cpu"] - p["cpu_at_first"]
        kind = kind_of(p["cmdline"], p["name"])
        entry = by_kind.setdefault(kind, {"cpu_s": 0.0, "processes": 0})
        entry["cpu_s"] += spent
        entry["processes"] += spent > 0
        rows.append((spent, kind, pid, p))
    accounted = sum(e["cpu_s"] for e in by_kind.values())
    ordered = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"]))
    for entry in ordered.values():
        entry["share"] = round(entry["cpu_s"] / accounted, 4) if accounted else 0.0
        entry["cpu_s"] = round(entry["cpu_s"], 1)
    top = [
        {
            "cpu_s": round(spent, 1),
            "kind": kind,
            "pid": pid,
            "from_s": round(p["first_s"] - t0),
            "lived_s": round(p["last_s"] - p["first_s"]),
            "cmdline": p["cmdline"][:200],
        }
        for spent, kind, pid, p in sorted(rows, key=lambda r: -r[0])[:30]
    ]
    # the index of each minute's first sample, then the last sample's
    starts = [0]
    for k, (t, _, _) in enumerate(ticks):
        while t - t0 >= 60 * len(starts):
            starts.append(k)
    starts.append(len(ticks) - 1)
    idle_by_minute = []
    for start, end in itertools.pairwise(starts):
        if end <= start:
            break
        busy, idle = ticks[end][1] - ticks[start][1], ticks[end][2] - ticks[start][2]
        idle_by_minute.append(round(idle / (busy + idle), 3) if busy + idle else 0.0)
    (t_first, busy0, idle0), (t_last, busy1, idle1) = ticks[0], ticks[-1]
    return {
        "machine": {
            "cores": cores,
            "seconds": round(t_last - t_first, 1),
            "busy_core_s": round((busy1 - busy0) / TICK, 1),
            "idle_core_s": round((idle1 - idle0) / TICK, 1),
        },
        "idle_share_by_minute": idle_by_minute,
        "accounted_cpu_s": round(accounted, 1),
        "by_kind": ordered,
        "top_processes": top,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name the command to run after --")
    processes: dict = {}
    t0 = time.time()
    ticks = [(t0, *machine_ticks())]
    sample(processes, t0)
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(args.interval)
        now = time.time()
        sample(processes, now)
        ticks.append((now, *machine_ticks()))
    ticks.append((time.time(), *machine_ticks()))
    result = {
        "command": command,
        "rc": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "interval_s": args.interval,
        **summarize(processes, ticks, t0, os.cpu_count() or 1),
    }
    write_result(Path(args.out), result)
    for kind, entry in result["by_kind"].items():
        share = 100 * entry["share"]
        print(f"{entry['cpu_s']:9.1f} s {share:5.1f}% {entry['processes']:5d}  {kind}")
    machine = result["machine"]
    print(
        f"{result['wall_s']:.0f} s: {machine['busy_core_s']:.0f} core-s busy, "
        f"{machine['idle_core_s']:.0f} idle; accounted {result['accounted_cpu_s']:.0f} s"
    )
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
