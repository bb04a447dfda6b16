"""The run's report: one self-contained HTML page (plots inlined) and a Markdown twin.

Reads every stage's stats and manifest, draws the benchmark plots, and puts the verdict on
top: a drafter that does not work (tau ~ 1) or slows decoding is announced in red, never left
to a table. With several drafter methods, their benchmarks, training and consistency records
stand side by side.
"""

from __future__ import annotations

import base64
import html
import logging
import os
from pathlib import Path
from typing import Any

from . import methods
from .config import HELDOUT_SET
from .fileio import atomic_path, read_json

log = logging.getLogger(__name__)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or v == {}:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x, digits)}" for k, x in v.items())
    return str(v)


# ---- plots -------------------------------------------------------------------------------------


def _label(r: dict, methods: int, sep: str = " ") -> str:
    """A run's label: method (when several are compared), prompt set, k, T, concurrency."""
    who = f"{r['method']}{sep}" if methods > 1 else ""
    return f"{who}{r['prompt_set']}{sep}k={r['k']} T={r['temperature']} c={r['concurrency']}"


def plot_bench(runs: list[dict], plots_dir: Path) -> dict[str, Path]:
    """The benchmark plots of every method's runs side by side (``runs`` carry ``method``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in runs if r.get("acceptance_length") is not None]
    out: dict[str, Path] = {}
    if not runs:
        return out
    n_methods = len({r["method"] for r in runs})

    def save(fig, key: str) -> None:
        fig.tight_layout()
        out[key] = plots_dir / f"{key}.png"
        fig.savefig(out[key], dpi=110)
        plt.close(fig)

    # Per-position acceptance: one group of bars per draft position, one bar per run.
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(runs)
    longest = max(len(r["per_position"] or []) for r in runs)
    for j, r in enumerate(runs):
        pos = r["per_position"] or []
        ax.bar([i + j * width for i in range(len(pos))], pos, width, label=_label(r, n_methods))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / drafts)")
    ax.set_title("Per-position acceptance")
    ax.set_ylim(0, 1)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(longest)])
    ax.set_xticklabels([str(i + 1) for i in range(longest)])
    ax.legend(fontsize=7)
    save(fig, "acceptance_per_position")

    # Acceptance length, measured next to what training validation predicts.
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = range(len(runs))
    ax.bar(xs, [r["acceptance_length"] for r in runs], 0.4, label="measured")
    predicted = [r.get("predicted_acceptance_length") or 0 for r in runs]
    ax.bar([x + 0.4 for x in xs], predicted, 0.4, label="predicted by validation", alpha=0.8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([x + 0.2 for x in xs])
    ax.set_xticklabels([_label(r, n_methods, "\n") for r in runs], fontsize=7)
    ax.set_ylabel("acceptance length τ (tokens per step)")
    ax.set_title("Acceptance length per prompt set")
    ax.legend(fontsize=8)
    save(fig, "acceptance_length")

    # Throughput: per prompt set (and T, concurrency) the shared baseline, then every drafter
    # (method, k), each with its speedup over that baseline.
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["prompt_set"], r["temperature"], r["concurrency"]), []).append(r)
    bars = 1 + max(len(g) for g in groups.values())
    width = 0.8 / bars
    fig, ax = plt.subplots(figsize=(8, 4.2))
    drafters = sorted({(r["method"], r["k"]) for r in runs}, key=str)
    colors = {d: f"C{i + 1}" for i, d in enumerate(drafters)}
    for gi, group in enumerate(groups.values()):
        base = group[0]
        ax.bar(
            gi,
            base["baseline_tokens_per_s"],
            width,
            color="C0",
            yerr=_spread(base["baseline_tokens_per_s"], base.get("baseline_tokens_per_s_rounds")),
        )
        for j, r in enumerate(group, 1):
            x = gi + j * width
            ax.bar(
                x,
                r["tokens_per_s"],
                width,
                color=colors[(r["method"], r["k"])],
                yerr=_spread(r["tokens_per_s"], r.get("tokens_per_s_rounds")),
            )
            ax.text(
                x, r["tokens_per_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=7
            )
    ax.bar([], [], color="C0", label="without drafter")
    for d, color in colors.items():
        ax.bar([], [], color=color, label=f"{d[0]} k={d[1]}")
    ax.set_xticks([gi + (bars - 1) * width / 2 for gi in range(len(groups))])
    ax.set_xticklabels([f"{n}\nT={t} c={c}" for n, t, c in groups], fontsize=7)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput with and without each drafter (median, min-max of the rounds)")
    ax.legend(fontsize=8)
    save(fig, "throughput")
    return out


def _spread(mid: float, rounds: list[float] | None) -> list[list[float]] | None:
    """Error bar from the median to the min and max of the rounds (None: one round)."""
    if not rounds or len(rounds) < 2:
        return None
    return [[mid - min(rounds)], [max(rounds) - mid]]


# ---- content ----------------------------------------------------------------------------------

VERDICT_NOTE = (
    "τ = 1 + accepted / drafts from vLLM's spec-decode counters; τ predicted from validation: "
    "1 + Σ_i Π_{{j≤i}} a_j over EAGLE-3's conditional accuracies per TTT step; for DFlash its "
    "expected accepted length (eal) over the block when k = block size - 1, else the same sum "
    "over its per-position accuracies (an estimate). The prediction comes from validation on "
    "the training distribution, so it is judged on the held-out set ('{heldout}': prompts taken "
    "out of the training pool, never trained on) only: there a measured τ far below it points "
    "at a train/serve mismatch. Other sets are shown with it for reference; a set far from the "
    "training prompts (another language, harder questions) is expected to score lower. Speedup "
    "= tok/s with the drafter / tok/s without it: the median over the rounds (bench.rounds), "
    "each a pass over the whole prompt set, with its min–max in brackets. With bench.pairing "
    "alternate the baseline server runs beside the drafter's and the rounds alternate between "
    "them (the speedup is paired per round); with separate one baseline is measured for every "
    "method and the range allows for every combination of rounds. ~ marks a speedup whose "
    "range crosses 1: within noise. Below 1 the drafter makes decoding slower."
)


def _speedup_cell(r: dict) -> str:
    """'0.84x (0.81–0.86)', '~' appended when the range crosses 1; '0.84x' for one round."""
    cell = f"{_fmt(r['speedup'])}x"
    lo_hi = r.get("speedup_range")
    if r.get("rounds", 1) > 1 and lo_hi:
        cell += f" ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})"
        if r.get("significance") == "within noise":
            cell += " ~"
    return cell


def _benchmark(methods: dict[str, dict]) -> list:
    blocks: list = []
    rows = []
    for method, m in methods.items():
        verdict = m["bench"].get("verdict", {})
        prefix = f"{method}: " if len(methods) > 1 else ""
        blocks.append(
            ("banner", verdict.get("ok", False), prefix + verdict.get("message", "no verdict"))
        )
        blocks += [("banner", False, prefix + p) for p in verdict.get("problems", [])[1:]]
        for r in m["bench"].get("runs", []):
            ovb = r.get("outputs_vs_baseline")
            rows.append(
                [
                    method,
                    f"{HELDOUT_SET} (never trained on)"
                    if r["prompt_set"] == HELDOUT_SET
                    else r["prompt_set"],
                    r["k"],
                    r["temperature"],
                    r["concurrency"],
                    _fmt(r["acceptance_length"]),
                    _fmt(r.get("predicted_acceptance_length")),
                    " / ".join(_fmt(p, 2) for p in (r["per_position"] or [])),
                    _fmt(r["tokens_per_s"]),
                    _fmt(r["baseline_tokens_per_s"]),
                    _speedup_cell(r),
                    f"{ovb['differing']}/{ovb['compared']}" if ovb else "–",
                ]
            )
    header = [
        "method",
        "prompt set",
        "k",
        "T",
        "conc.",
        "τ measured",
        "τ predicted",
        "acceptance per position",
        "tok/s drafter",
        "tok/s baseline",
        "speedup (min–max)",
        "outputs differing (T=0)",
    ]
    return [
        *blocks,
        ("table", header, rows),
        ("p", VERDICT_NOTE.format(heldout=HELDOUT_SET)),
        ("img", "acceptance_length"),
        ("img", "acceptance_per_position"),
        ("img", "throughput"),
    ]


def _drafter_shape(train: dict) -> str:
    """Draft layers and what they draft, from the trainer fields of the drafter's training."""
    t = (train.get("config") or {}).get("trainer") or {}
    if not t:
        return "–"
    return methods.get(t.get("speculator_type")).shape(t)


def _side_by_side(methods: dict[str, dict]) -> list:
    """One row per method and k: what it is, what training cost, and per prompt set its τ and
    speedup (first temperature and concurrency measured)."""
    sets: list[str] = []
    for m in methods.values():
        sets += [r["prompt_set"] for r in m["bench"].get("runs", []) if r["prompt_set"] not in sets]
    rows = []
    for method, m in methods.items():
        runs = m["bench"].get("runs", [])
        first = (runs[0]["temperature"], runs[0]["concurrency"]) if runs else None
        for k in dict.fromkeys(r["k"] for r in runs):
            at = {
                r["prompt_set"]: r
                for r in runs
                if r["k"] == k and (r["temperature"], r["concurrency"]) == first
            }
            train = m["train"]
            rows.append(
                [
                    method,
                    _drafter_shape(train),
                    k,
                    _fmt(train.get("wall_s"), 3),
                    _fmt((train.get("throughput") or {}).get("tokens_per_s")),
                    *(
                        f"{_fmt(at[s]['acceptance_length'])} / {_speedup_cell(at[s])}"
                        if s in at
                        else "–"
                        for s in sets
                    ),
                ]
            )
    note = (
        "Each method's drafter is trained from the same prepared rows, draft vocabulary and "
        "hidden states and benchmarked on the same prompts against the target without a "
        "drafter. Cells: τ measured / speedup (median, min–max over the rounds)"
    )
    if rows and methods:
        any_run = next(
            (m["bench"]["runs"][0] for m in methods.values() if m["bench"].get("runs")), None
        )
        if any_run:
            note += f" at T={any_run['temperature']}, concurrency {any_run['concurrency']}"
    header = ["method", "drafter", "k", "training time (s)", "training tok/s", *sets]
    return [("table", header, rows), ("p", note + ".")]


def _consistency(methods: dict[str, dict]) -> list:
    blocks: list = []
    facts: dict[str, dict] = {}
    for method, m in methods.items():
        cons = m["bench"].get("consistency", {})
        prefix = f"{method}: " if len(methods) > 1 else ""
        blocks.append(
            (
                "banner",
                cons.get("ok", False),
                prefix
                + (
                    "drafter config matches extraction and target"
                    if cons.get("ok")
                    else "; ".join(cons.get("problems", ["not checked"]))
                ),
            )
        )
        for note in m["bench"].get("served_with_shorter_block", []):
            blocks.append(("banner", False, f"{prefix}NOT SERVED AS TRAINED at {note}"))
        facts[method] = cons.get("drafter") or {}
    fields = list(dict.fromkeys(f for fs in facts.values() for f in fs))
    rows = [[f, *(_fmt(facts[m].get(f)) for m in methods)] for f in fields]
    return [*blocks, ("table", ["field", *methods], rows)]


def _training(name: str, train: dict) -> list:
    """Drafter ``name``'s training (a method's or a variant's: its metrics say which method)."""
    from .bench.verdict import best_val

    own = methods.get(train.get("method"))
    val = best_val(train)
    tp = train.get("throughput") or {}
    epochs = f"{len(train.get('epochs', []))} (epoch {_fmt(train.get('best_epoch'))})"
    acc = lambda xs: " / ".join(_fmt(x, 3) for x in xs or [])  # noqa: E731
    series = own.accuracy_series
    per = own.position_label
    val_rows = [
        [f"validation {field.replace('_', ' ')} per {per}", acc(val.get(field))]
        for field, _ in series
    ]
    if "eal" in val:
        val_rows.append(["validation expected accepted length (eal)", _fmt(val.get("eal"))])
    return [
        (
            "table",
            ["", ""],
            [
                ["drafter", _drafter_shape(train)],
                [f"epochs (exported: best by {train.get('best_by', 'validation loss')})", epochs],
                ["validation loss", _fmt(val.get("loss"))],
                *val_rows,
                ["training tokens/s", _fmt(tp.get("tokens_per_s"))],
                ["loader wait share of step time", _fmt(tp.get("loader_wait_fraction"))],
                ["wall time (s)", _fmt(train.get("wall_s"))],
            ],
        ),
        (
            "table",
            ["epoch", "train loss", "val loss", *(f"val {f.replace('_', ' ')}" for f, _ in series)],
            [
                [
                    e["epoch"],
                    _fmt(e["train"]["loss"]),
                    _fmt((e.get("val") or {}).get("loss")),
                    *(acc((e.get("val") or {}).get(f)) for f, _ in series),
                ]
                for e in train.get("epochs", [])
            ],
        ),
        ("img", f"train_{name}"),
    ]


def sections(d: dict[str, dict]) -> list[tuple[str, list]]:
    """Report content as (title, blocks); a block is ("p", text), ("table", header, rows),
    ("img", key) or ("banner", ok, text). ``d["methods"]`` maps each drafter method to its
    ``{"bench": bench metrics, "train": train metrics}``; the other keys are the stages'."""
    synth, manifest = d["synth"], d["manifest"]
    vocab, prompts, prepare = d["vocab"], d["prompts"], d["prepare"]
    methods = d["methods"]
    out: list[tuple[str, list]] = [("Benchmark", _benchmark(methods))]
    if len(methods) > 1:
        out.append(("Methods side by side", _side_by_side(methods)))
    out.append(("Train/serve consistency", _consistency(methods)))

    tc = synth.get("template_check", {})
    out.append(
        (
            "Synthetic data",
            [
                (
                    "table",
                    ["", ""],
                    [
                        [
                            "samples ok / prompts",
                            f"{_fmt(synth.get('samples_ok'))} / {_fmt(synth.get('prompts'))}",
                        ],
                        [
                            "failed or rejected",
                            _fmt(synth.get("samples_failed"))
                            if synth.get("samples_failed")
                            else "0",
                        ],
                        [
                            "prompt / completion tokens",
                            f"{_fmt(synth.get('prompt_tokens'))} / "
                            f"{_fmt(synth.get('completion_tokens'))}",
                        ],
                        ["finish reasons", _fmt(synth.get("finish_reasons"))],
                        ["reasoning capture rate", _fmt(synth.get("reasoning_capture_rate"))],
                        ["template check: text mismatches", _fmt(tc.get("text_mismatches"))],
                        [
                            "template check: same text, other tokens",
                            _fmt(tc.get("tokenization_only")),
                        ],
                        [
                            "generation tokens/s (all runs that generated)",
                            _fmt((synth.get("generation") or {}).get("completion_tokens_per_s")),
                        ],
                    ],
                ),
                (
                    "table",
                    [
                        "prompt source",
                        "use",
                        "rows read",
                        "usable",
                        "skipped (bad)",
                        "duplicates",
                        "sampled",
                    ],
                    [
                        [
                            name,
                            use,
                            _fmt(s.get("rows_read")),
                            _fmt(s.get("kept")),
                            ", ".join(f"{k} {v}" for k, v in (s.get("skipped") or {}).items() if v)
                            or "0",
                            _fmt(s.get("duplicates")),
                            _fmt(s.get("sampled")),
                        ]
                        for use in ("train", "bench")
                        for name, s in (prompts.get(use) or {}).items()
                    ],
                ),
            ],
        )
    )

    out.append(
        (
            "Training rows and vocabulary",
            [
                (
                    "table",
                    ["", ""],
                    [
                        [k, _fmt(v)]
                        for k, v in prepare.items()
                        if k not in ("provenance",) and not isinstance(v, dict)
                    ],
                ),
                (
                    "table",
                    ["", ""],
                    [[k, _fmt(v)] for k, v in vocab.items() if k not in ("provenance",)],
                ),
                ("img", "vocab"),
            ],
        )
    )

    v = manifest.get("verification", {})
    out.append(
        (
            "Hidden-state extraction",
            [
                (
                    "table",
                    ["", ""],
                    [
                        [
                            "samples / tokens",
                            f"{_fmt(manifest.get('num_samples'))} / {_fmt(manifest.get('tokens'))}",
                        ],
                        ["layers (aux + final)", _fmt(manifest.get("layer_ids"))],
                        [
                            "storage, bytes per token",
                            f"{manifest.get('storage')}, {_fmt(manifest.get('bytes_per_token'))}",
                        ],
                        [
                            "next-token agreement",
                            _fmt(v.get("next_token_agreement"), 4)
                            + f" over {_fmt(v.get('next_token_positions'))} positions",
                        ],
                        [
                            "reference forward: max relative error",
                            _fmt(v.get("reference_max_rel_error")),
                        ],
                        ["reference error per layer", _fmt(v.get("reference_per_layer"))],
                        [
                            "extraction tokens/s (per part, last run)",
                            _fmt(
                                [
                                    p["this_run"].get("tokens_per_s")
                                    for p in manifest.get("parts", [])
                                ]
                            ),
                        ],
                    ],
                ),
            ],
        )
    )

    for method, m in methods.items():
        out.append(
            (
                f"Training: {method}" if len(methods) > 1 else "Training",
                _training(method, m["train"]),
            )
        )

    prov_rows = []
    stages = {
        name: d.get(name) for name in ("target", "prompts", "synth", "prepare", "vocab", "manifest")
    }
    for method, m in methods.items():
        stages[f"train {method}"], stages[f"bench {method}"] = m["train"], m["bench"]
    for name, data in stages.items():
        p = (data or {}).get("provenance") or {}
        if p:
            prov_rows.append(
                [name, p.get("config_hash"), (p.get("code") or {}).get("git"), p.get("created")]
            )
    benches = [m["bench"] for m in methods.values()]
    pk = next(
        (
            b["provenance"]["packages"]
            for b in benches
            if (b.get("provenance") or {}).get("packages")
        ),
        {},
    )
    out.append(
        (
            "Provenance",
            [
                ("table", ["stage", "config hash", "code (git describe)", "created"], prov_rows),
                ("table", ["package", "version"], [[k, v] for k, v in sorted(pk.items())]),
            ],
        )
    )
    return out


def _img_tag(path: Path | None) -> str:
    if not path or not Path(path).exists():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<p><img src="data:image/png;base64,{data}" style="max-width:100%"></p>'


def render_html(title: str, content: list[tuple[str, list]], images: dict[str, Path]) -> str:
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;"
        "padding:0 1em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px;text-align:left}"
        "th{background:#f3f3f3}.ok{background:#e6f4ea;border-left:6px solid #1e8e3e}"
        ".bad{background:#fce8e6;border-left:6px solid #d93025;font-weight:bold}"
        ".banner{padding:10px 14px;margin:1em 0}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for heading, blocks in content:
        parts.append(f"<h2>{e(heading)}</h2>")
        for b in blocks:
            if b[0] == "p":
                parts.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "banner":
                parts.append(f"<div class='banner {'ok' if b[1] else 'bad'}'>{e(b[2])}</div>")
            elif b[0] == "table":
                parts.append(
                    "<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in b[1]) + "</tr>"
                )
                for row in b[2]:
                    parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
                parts.append("</table>")
            elif b[0] == "img":
                parts.append(_img_tag(images.get(b[1])))
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(
    title: str, content: list[tuple[str, list]], images: dict[str, Path], base: Path
) -> str:
    lines = [f"# {title}", ""]
    for heading, blocks in content:
        lines += [f"## {heading}", ""]
        for b in blocks:
            if b[0] == "p":
                lines += [b[1], ""]
            elif b[0] == "banner":
                lines += [("**OK:** " if b[1] else "**PROBLEM:** ") + b[2], ""]
            elif b[0] == "table":
                header = [str(h) or " " for h in b[1]]
                lines.append("| " + " | ".join(header) + " |")
                lines.append("|" + "---|" * len(header))
                for row in b[2]:
                    lines.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
                lines.append("")
            elif b[0] == "img" and images.get(b[1]) and Path(images[b[1]]).exists():
                rel = os.path.relpath(Path(images[b[1]]).resolve(), base.resolve())
                lines += [f"![{b[1]}]({rel})", ""]
    return "\n".join(lines)


def build(
    inputs: dict[str, str],
    methods: dict[str, dict[str, str]],
    html_out,
    markdown_out,
    plots_dir,
    run_name: str,
    bench_prompt_stats: list[str] = (),
) -> None:
    """``inputs`` names each stage's JSON output (and the vocab plot); ``methods`` maps each
    drafter method to its ``{"train": metrics.json, "train_plot": loss.png, "bench":
    metrics.json}``; ``bench_prompt_stats`` are the stats files of the benchmark prompt sets,
    merged into the prompts section."""
    data = {name: read_json(path) for name, path in inputs.items() if str(path).endswith(".json")}
    if "prompts" in data:
        data["prompts"]["bench"] = {
            name: st for path in bench_prompt_stats for name, st in read_json(path)["bench"].items()
        }
    for name in ("synth", "manifest", "vocab", "prompts", "prepare", "target"):
        data.setdefault(name, {})
    data["methods"] = {
        m: {"train": read_json(paths["train"]), "bench": read_json(paths["bench"])}
        for m, paths in methods.items()
    }
    plots_dir = Path(plots_dir)
    runs = [r for m in data["methods"].values() for r in m["bench"].get("runs", [])]
    images = plot_bench(runs, plots_dir)
    images["vocab"] = Path(inputs["vocab_plot"]) if "vocab_plot" in inputs else None
    for m, paths in methods.items():
        images[f"train_{m}"] = Path(paths["train_plot"])
    title = f"Drafter report ({', '.join(methods)}): run {run_name}"
    content = sections(data)
    with atomic_path(html_out) as tmp:
        tmp.write_text(render_html(title, content, images))
    with atomic_path(markdown_out) as tmp:
        tmp.write_text(render_markdown(title, content, images, Path(markdown_out).parent))
    log.info("report: %s", html_out)
