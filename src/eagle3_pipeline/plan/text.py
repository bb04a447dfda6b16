"""The plan as a user reads it: label: value lines, a table of the GPU stages and one of the
three ``extract.mode`` choices (:func:`format_plan`; docs/plan.md shows one)."""

from __future__ import annotations

from ..hidden_states.disk import BYTES_PER_VALUE
from ..runtime.disk import GIB
from .modes import MODES


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:,.1f} GiB"


def _size(n: float | None) -> str:
    """GiB, or MiB below a tenth of one (a few samples in flight)."""
    return _gib(n) if n is None or n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _gpu_hours(e: dict) -> str:
    hours = e["gpu_hours"]
    return f"{e['bound']} {hours:,.0f}" if hours >= 10 else f"{e['bound']} {hours:.1f}"


def _count(n: float) -> str:
    """A count of billions or millions of tokens, short enough to read."""
    for size, suffix in ((1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:,.2f}{suffix}"
    return f"{n:,.0f}"


def _stage_time(stage: dict) -> str:
    """How a stage's wall time is made up, and where its rate comes from."""
    e = stage.get("estimate")
    if not e:
        return f"not estimated: {stage['not_estimated']}"
    jobs = stage["jobs"]
    rate = f"{e['rate']:,.0f} {e['unit']}"
    if e["speedup"] > 1:
        rate = f"({rate} x {e['speedup']} GPUs)"
    load = f" + a {_hours(e['load_seconds'])} model load" if e["load_seconds"] else ""
    text = (
        f"{e['bound']} {_hours(e['seconds'])} = {_count(e['work'])} {stage['work_unit']} / "
        f"{jobs} job{'s' if jobs > 1 else ''} / {rate}{load} (estimate: rate measured on "
        f"{e['measured_on']}, {e['file']})"
    )
    if stage.get("servers_per_job", 1) > 1:
        text += (
            f"; {stage['servers_per_job']} servers share each job's GPU: their gain is not "
            "measured, so not counted"
        )
    if stage.get("extracts"):
        x = stage["extracts"]
        text = (
            f"{e['bound']} {_hours(e['seconds'])}: extract.mode {x['mode']}, {x['how']}; "
            f"training alone {text.replace(_hours(e['seconds']), _hours(x['training_seconds']), 1)}"
        )
    if stage.get("read_bytes_per_s"):
        speeds = ", ".join(f"{v / 1e9:,.1f} GB/s {k}" for k, v in stage["read_bytes_per_s"].items())
        text += f"; the GPUs keep that rate only if the hidden states are read at {speeds}"
    return text


def _stage_table(stages: dict) -> list[str]:
    """One row per stage: jobs, GPUs, wall time, GPU-hours, hidden-state bytes per storage."""
    rows = [
        (
            "stage",
            "jobs",
            "GPUs per job",
            "GPUs at once",
            "wall time",
            "GPU-hours",
            f"hidden states {' / '.join(BYTES_PER_VALUE)}",
        )
    ]
    for name, st in stages.items():
        gpus, nodes, e = st["gpus_per_job"], st.get("nodes_per_job", 1), st.get("estimate")
        per_job = str(gpus) if nodes == 1 else f"{gpus} ({nodes} nodes x {gpus // nodes})"
        hs = st.get("hidden_states")
        rows.append(
            (
                name,
                f"{st['jobs']:,}",
                per_job if gpus else "CPU",
                f"{st['jobs'] * gpus:,}" if gpus else "-",
                f"{e['bound']} {_hours(e['seconds'])}" if e else "not estimated",
                _gpu_hours(e) if e and gpus else "-",
                " / ".join(_gib(b) for b in hs["bytes"].values()) + f" {hs['io']}" if hs else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {1, 3}  # counts align right
    return [
        "    "
        + "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _train_gpus(g: dict) -> str:
    trainer = str(g["trainer"]) if g["trainer"] else "CPU"
    if g.get("colocated"):
        return f"{trainer} (servers on the trainer's)"
    if not g["servers"]:
        return trainer
    return f"{g['trainer'] + g['servers']} ({trainer} trainer + {g['servers']} servers)"


def _modes_table(modes: dict) -> list[str]:
    """One row per extract.mode: disk high-water mark, train job GPUs, time."""
    rows = [("mode", "disk high-water", "train job GPUs", "extract + train")]
    for name in MODES:
        m = modes[name]
        time = (
            f"{m['bound']} {_hours(m['seconds'])}" if m["seconds"] is not None else "not estimated"
        )
        gpus = _train_gpus(m["train_gpus"])
        rows.append((name, _size(m["disk_bytes"]), gpus, f"{time} ({m['how']})"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["    " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def format_plan(plan: dict) -> str:
    """The plan as label: value lines, with a table of the GPU stages."""
    lines = [f"Plan for {plan['run']} (docs/plan.md):"]
    add = lambda k, val: lines.append(f"  {k:<17} {val}")  # noqa: E731
    tg = plan.get("target")
    if tg:
        moe = f", {tg['experts']} experts" if tg["experts"] else ""
        quant = f", {tg['quantization']}" if tg["quantization"] else ""
        add(
            "target",
            f"{(tg['architectures'] or ['?'])[0]} ({tg['model_type']}): "
            f"{tg['num_layers']} layers, hidden {tg['hidden_size']}, vocab {tg['vocab_size']:,}, "
            f"{tg['attention']}{moe}{quant}; {tg['params_total'] / 1e9:,.1f}B params "
            f"({tg['params_active'] / 1e9:,.1f}B active) from {tg['config_from']}",
        )
        add("weights", f"{_gib(tg['weight_bytes'])} ({tg['weight_bytes_from']})")
        added = " ".join(tg.get("server_args_added") or [])
        if tg.get("served_dtype") not in (None, "auto") or added:  # what the pipeline decided
            add("served", f"in {tg['served_dtype']}" + (f", with {added}" if added else ""))
    if plan.get("layers"):
        ly = plan["layers"]
        add("layers", f"aux {ly['aux']} + final {ly['final']} (captured {ly['captured']})")
    add("draft vocab K", plan["draft_vocab_size"])
    r = plan["rows"]
    samples = "?" if r["samples"] is None else f"{r['samples']:,}"
    tokens = "?" if r["tokens"] is None else f"{r['tokens']:,}"
    add("rows", f"{samples} x {r['tokens_per_sample']:,.0f} tokens = {tokens} tokens ({r['how']})")
    if plan.get("disk"):
        d = plan["disk"]
        mode = plan.get("mode", "stored")
        add(
            "hidden states",
            f"{_size(d['hidden_state_bytes'])} ({d['storage']}"
            + ("" if mode == "stored" else f", extract.mode {mode}: the most on the disk at once")
            + f"; {_gib(d['already_stored_bytes'])} stored) vs {_gib(d['free_bytes'])} free at "
            f"{d['free_at']} (x{d['margin']} margin)",
        )
    if plan.get("gpu_memory"):
        g = plan["gpu_memory"]
        gpu = "? GiB" if g["gpu_gib"] is None else f"{g['gpu_gib']:.0f} GiB"
        add(
            "GPU memory",
            f"{_gib(g['weights_per_gpu_bytes'])} of weights per GPU at TP "
            f"{g['tensor_parallel_size']} vs {gpu} x {g['utilization']} ({g['gpu_gib_from']})"
            + (
                f"; synth: {g['synth_servers_per_gpu']} servers per GPU, "
                f"x {g['synth_server_share']:.3g} each"
                if g.get("synth_servers_per_gpu")
                else ""
            )
            + (
                f"; extraction: {g['extraction_servers_per_trainer_gpu']} server(s) on each "
                f"trainer GPU, x {g['extraction_server_share']:.3g} each"
                if g.get("extraction_servers_per_trainer_gpu")
                else ""
            ),
        )
    stages = plan["stages"]
    add(
        "per stage",
        "estimates: a stage's jobs at once, each on its own GPUs; wall time = the slowest job, "
        "GPU-hours = jobs x GPUs per job x wall time",
    )
    lines.extend(_stage_table(stages))
    if plan.get("modes"):
        add(
            "hidden states by",
            f"extract.mode (this run: {plan.get('mode', 'stored')}; docs/train.md): the disk "
            "each fills at most, a train job's GPUs, extraction and training together",
        )
        lines.extend(_modes_table(plan["modes"]))
    if plan.get("totals"):
        for name, st in stages.items():
            add(f"{name} time", _stage_time(st))
        t = plan["totals"]
        gpu_hours = f" and {_gpu_hours(t)} GPU-hours" if t["gpu_hours"] else ""
        not_counted = ", ".join([*t["left_out"], "the CPU-only stages"])
        add(
            "run total",
            f"{t['bound']} {_hours(t['seconds'])}{gpu_hours}: {' + '.join(t['stages'])} one "
            f"after another (estimates; not counted: {not_counted})",
        )
    if plan.get("model_load"):
        m = plan["model_load"]
        add(
            "model load",
            f">= {_hours(m['seconds'])} per job that starts a vLLM server (assumption: "
            f"{_gib(m['weight_bytes'])} of weights at {m['bytes_per_s'] / 1e9:.1f} GB/s, "
            f"{m['source']})",
        )
    b = plan["train_batch"]
    processes = (
        f"{b['processes']} processes (train.gpus {b['gpus_per_node']} x train.nodes {b['nodes']})"
        if b["gpus_per_node"]
        else "1 process on the CPU"
    )
    add(
        "train batch",
        f"up to {b['global_tokens']:,} tokens per optimizer step = {b['tokens_per_process']:,} "
        f"per process (train.total_seq_len) x {processes}; train.lr {b['lr']} is used as "
        "set, not scaled with the batch",
    )
    for p in plan["problems"]:
        lines.append(
            f"  WARNING [{p['check']}], a real run stops before its first job: {p['message']}"
        )
    return "\n".join(lines)
