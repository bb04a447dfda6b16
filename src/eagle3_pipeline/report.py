"""The run's report: one self-contained HTML page (plots inlined) and a Markdown twin.

Reads every stage's stats and manifest, draws the benchmark plots, and puts the verdict on
top: a drafter that does not work (tau ~ 1) is announced in red, never left to a table.
"""

from __future__ import annotations

import base64
import html
import logging
import os
from pathlib import Path
from typing import Any

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


def plot_bench(bench: dict, plots_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in bench.get("runs", []) if r.get("acceptance_length") is not None]
    out: dict[str, Path] = {}
    if not runs:
        return out

    # Per-position acceptance: one group of bars per draft position, one bar per run.
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(runs)
    for j, r in enumerate(runs):
        pos = r["per_position"] or []
        ax.bar(
            [i + j * width for i in range(len(pos))],
            pos,
            width,
            label=f"{r['prompt_set']} k={r['k']} T={r['temperature']} c={r['concurrency']}",
        )
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / drafts)")
    ax.set_title("Per-position acceptance")
    ax.set_ylim(0, 1)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(max(len(r["per_position"] or []) for r in runs))]
    )
    ax.set_xticklabels([str(i + 1) for i in range(max(len(r["per_position"] or []) for r in runs))])
    ax.legend(fontsize=7)
    fig.tight_layout()
    out["acceptance_per_position"] = plots_dir / "acceptance_per_position.png"
    fig.savefig(out["acceptance_per_position"], dpi=110)
    plt.close(fig)

    labels = [
        f"{r['prompt_set']}\nk={r['k']} T={r['temperature']} c={r['concurrency']}" for r in runs
    ]

    def paired_bars(
        key: str,
        first: tuple[str, list],
        second: tuple[str, list],
        ylabel: str,
        title: str,
        hline: float | None = None,
    ) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(runs))
        ax.bar(xs, first[1], 0.4, label=first[0])
        ax.bar([x + 0.4 for x in xs], second[1], 0.4, label=second[0], alpha=0.8)
        if hline is not None:
            ax.axhline(hline, color="grey", lw=0.8)
        ax.set_xticks([x + 0.2 for x in xs])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out[key] = plots_dir / f"{key}.png"
        fig.savefig(out[key], dpi=110)
        plt.close(fig)

    paired_bars(
        "acceptance_length",
        ("measured", [r["acceptance_length"] for r in runs]),
        (
            "predicted by training validation",
            [r.get("predicted_acceptance_length") or 0 for r in runs],
        ),
        "acceptance length τ (tokens per step)",
        "Acceptance length per prompt set",
        hline=1.0,
    )
    paired_bars(
        "throughput",
        ("without drafter", [r["baseline_tokens_per_s"] for r in runs]),
        ("with drafter", [r["tokens_per_s"] for r in runs]),
        "output tokens/s",
        "Throughput with and without the drafter (same job)",
    )
    return out


# ---- content ----------------------------------------------------------------------------------


def sections(d: dict[str, dict]) -> list[tuple[str, list]]:
    """Report content as (title, blocks); a block is ("p", text), ("table", header, rows),
    ("img", key) or ("banner", ok, text)."""
    bench, synth, manifest = d["bench"], d["synth"], d["manifest"]
    train, vocab, prompts, prepare = d["train"], d["vocab"], d["prompts"], d["prepare"]
    verdict = bench.get("verdict", {})
    out: list[tuple[str, list]] = []

    rows = []
    for r in bench.get("runs", []):
        ovb = r.get("outputs_vs_baseline")
        rows.append(
            [
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
                _fmt(r["speedup"]),
                f"{ovb['differing']}/{ovb['compared']}" if ovb else "–",
            ]
        )
    out.append(
        (
            "Benchmark",
            [
                (
                    "banner",
                    verdict.get("ok", False),
                    verdict.get("message", "no benchmark verdict"),
                ),
                *[("banner", False, p) for p in verdict.get("problems", [])[1:]],
                (
                    "table",
                    [
                        "prompt set",
                        "k",
                        "T",
                        "conc.",
                        "τ measured",
                        "τ predicted",
                        "acceptance per position",
                        "tok/s drafter",
                        "tok/s baseline",
                        "speedup",
                        "outputs differing (T=0)",
                    ],
                    rows,
                ),
                (
                    "p",
                    "τ = 1 + accepted / drafts from vLLM's spec-decode counters; τ predicted = "
                    "1 + Σ_i Π_{j≤i} a_j from the validation conditional accuracies a_j. The "
                    "prediction comes from validation on the training distribution, so it is "
                    f"judged on the held-out set ('{HELDOUT_SET}': prompts taken out of the "
                    "training pool, never trained on) only: there a measured τ far below it "
                    "points at a train/serve mismatch. Other sets are shown with it for "
                    "reference; a set far from the training prompts (another language, harder "
                    "questions) is expected to score lower. Speedup = tok/s with the drafter / "
                    "tok/s without it; below 1 the drafter makes decoding slower.",
                ),
                ("img", "acceptance_length"),
                ("img", "acceptance_per_position"),
                ("img", "throughput"),
            ],
        )
    )

    cons = bench.get("consistency", {})
    out.append(
        (
            "Train/serve consistency",
            [
                (
                    "banner",
                    cons.get("ok", False),
                    "drafter config matches extraction and target"
                    if cons.get("ok")
                    else "; ".join(cons.get("problems", ["not checked"])),
                ),
                (
                    "table",
                    ["field", "drafter"],
                    [[k, _fmt(v)] for k, v in (cons.get("drafter") or {}).items()],
                ),
            ],
        )
    )

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

    from .bench import best_val

    val = best_val(train)
    tp = train.get("throughput") or {}
    epochs = f"{len(train.get('epochs', []))} (epoch {_fmt(train.get('best_epoch'))})"
    acc = lambda xs: " / ".join(_fmt(x, 3) for x in xs or [])  # noqa: E731
    out.append(
        (
            "Training",
            [
                (
                    "table",
                    ["", ""],
                    [
                        ["epochs (exported: best by validation loss)", epochs],
                        ["validation loss", _fmt(val.get("loss"))],
                        ["validation full accuracy per TTT step", acc(val.get("full_acc"))],
                        ["validation conditional accuracy per TTT step", acc(val.get("cond_acc"))],
                        ["training tokens/s", _fmt(tp.get("tokens_per_s"))],
                        ["loader wait share of step time", _fmt(tp.get("loader_wait_fraction"))],
                        ["wall time (s)", _fmt(train.get("wall_s"))],
                    ],
                ),
                (
                    "table",
                    ["epoch", "train loss", "val loss", "val full acc", "val cond acc"],
                    [
                        [
                            e["epoch"],
                            _fmt(e["train"]["loss"]),
                            _fmt((e.get("val") or {}).get("loss")),
                            acc((e.get("val") or {}).get("full_acc")),
                            acc((e.get("val") or {}).get("cond_acc")),
                        ]
                        for e in train.get("epochs", [])
                    ],
                ),
                ("img", "train"),
            ],
        )
    )

    prov_rows = []
    for name in ("target", "prompts", "synth", "prepare", "vocab", "manifest", "train", "bench"):
        p = (d.get(name) or {}).get("provenance") or {}
        if p:
            prov_rows.append(
                [name, p.get("config_hash"), (p.get("code") or {}).get("git"), p.get("created")]
            )
    pk = ((bench.get("provenance") or {}).get("packages")) or {}
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
    html_out,
    markdown_out,
    plots_dir,
    run_name: str,
    bench_prompt_stats: list[str] = (),
) -> None:
    """``inputs`` names each stage's JSON output (and the plots); ``bench_prompt_stats`` are
    the stats files of the benchmark prompt sets, merged into the prompts section."""
    data = {name: read_json(path) for name, path in inputs.items() if str(path).endswith(".json")}
    if "prompts" in data:
        data["prompts"]["bench"] = {
            name: st for path in bench_prompt_stats for name, st in read_json(path)["bench"].items()
        }
    for name in ("bench", "synth", "manifest", "train", "vocab", "prompts", "prepare", "target"):
        data.setdefault(name, {})
    plots_dir = Path(plots_dir)
    images = plot_bench(data["bench"], plots_dir)
    images["vocab"] = Path(inputs["vocab_plot"]) if "vocab_plot" in inputs else None
    images["train"] = Path(inputs["train_plot"]) if "train_plot" in inputs else None
    title = f"EAGLE-3 drafter report: run {run_name}"
    content = sections(data)
    with atomic_path(html_out) as tmp:
        tmp.write_text(render_html(title, content, images))
    with atomic_path(markdown_out) as tmp:
        tmp.write_text(render_markdown(title, content, images, Path(markdown_out).parent))
    log.info("report: %s", html_out)
