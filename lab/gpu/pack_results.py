"""Pack what a GPU host run measured into one archive small enough to copy off the host.

    python3 lab/gpu/pack_results.py /tmp/w $OUT/h200-results.tar.xz \
        [--synth RUN...] [--drafters RUN...]

--synth also packs those runs' synth answers and journal (to carry to a later host: pack_parts),
--drafters those runs' trained drafters (config and weights), each set in parts that come back:
RUN for all of a run's drafters, RUN:NAME,NAME for some (a command brings back 64 MiB at most:
one DFlash drafter of the 135M target is 47 MiB). --slim leaves out a drafter's frozen copy of
the target's embeddings (EAGLE-3's: 57 of its 73 MiB) with the checksum that
lab/gpu/unpack_drafters.py checks when it puts them back from the target at home.

Takes every run's figures, plots, reports, configs of the drafters, Snakemake's job
benchmarks and logs (logs cut to their last MiB), the efficiency benchmarks' JSON and the plan's
status; leaves out the bulk (hidden states, datasets, model weights, synth records). The archive
must stay under the 16 MiB a remote command may return per file.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

KEEP = [
    "status.log",
    "plan.log",
    "bench/*.json",
    "bench/*.txt",
    "bench/*.raw.xz",  # py-spy profiles (lab/gil_profile.py --keep-raw)
    "logs/*.log",
    "online_drafters/logs/*.log",  # every online_rounds training's log (online_vs_stored.py)
    "repo/results/*/target/target.json",
    "repo/results/*/prompts/*.json",
    "repo/results/*/prompts/bench_*.jsonl",  # the sets a copied-off drafter is measured on
    "repo/results/*/synth/stats.json",
    "repo/results/*/prepare/stats.json",
    "repo/results/*/vocab/coverage.*",
    "repo/results/*/hidden_states/manifest.json",
    "repo/results/*/hidden_states/parts/*.json",
    "repo/results/*/drafter*/config.json",
    "repo/results/*/drafter*/metrics.json",
    "repo/results/*/drafter*/loss.png",
    "repo/results/*/drafter/*/config.json",  # one drafter per method (train.methods)
    "repo/results/*/drafter/*/metrics.json",
    "repo/results/*/drafter/*/loss.png",
    "repo/results/*/bench/*.json",
    "repo/results/*/bench/*/metrics.json",
    "repo/results/*/report/report.*",
    "repo/results/*/report/plots/*",
    "repo/results/*/benchmarks/*.tsv",
    "repo/results/*/logs/*.log",
    "repo/results/*/tau_vs_data/*",
    "repo/results/*/tau_vs_data/*/bench.json",
    "repo/results/*/tau_vs_data/*/drafter/metrics.json",
]
LOG_TAIL = 1 << 20
LIMIT = 15 << 20
# A run's synth journal (every answer, what lab/gpu/adopt_synth_journal.py reads) and stats, to
# copy off and carry to a later host so that its synth stage reuses them instead of generating
# again; synth.jsonl.zst is left out: it is the journal's answers again.
SYNTH = ["synth/stats.json", "synth/.partial/*"]
# A run's drafters: what vLLM loads (one drafter per method, or the single drafter of a run
# made before train.methods).
DRAFTERS = [f"drafter/{d}{f}" for d in ("", "*/") for f in ("*.json", "*.safetensors")]


# the frozen embeddings an EAGLE-3 drafter saves (a copy of the target's)
EMBED = "embed_tokens.weight"


def tensor_sha256(tensor) -> str:
    """sha256 of a tensor's bytes (any dtype, bfloat16 included)."""
    import hashlib

    import torch

    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def slim_weights(path: Path) -> tuple[bytes, dict] | None:
    """A drafter's weights without its frozen copy of the target's embeddings, and what
    identifies that copy (dtype, shape, sha256 of its bytes); None when it has none."""
    from safetensors.torch import load_file, save

    config = json.loads((path.parent / "config.json").read_text())
    tensors = load_file(path)
    if EMBED not in tensors or config.get("embed_requires_grad", True):
        return None
    embed = tensors.pop(EMBED)
    ident = {
        "tensor": EMBED,
        "dtype": str(embed.dtype).removeprefix("torch."),
        "shape": list(embed.shape),
        "sha256": tensor_sha256(embed),
    }
    return save(tensors), ident


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def pack_parts(
    base: Path,
    run: str,
    what: str,
    patterns: list[str],
    out: Path,
    compress: bool,
    slim: bool = False,
    tag: str = "",
) -> None:
    """Pack a run's files matching ``patterns`` into ``<run>-<what><tag>.tar[.xz].partNN``
    beside ``out``, each part small enough to come back. (xz takes minutes on a drafter's
    weights and gains little: those go uncompressed.) ``slim``: weights without their frozen
    embeddings (:func:`slim_weights`)."""
    files = sorted(p for pat in patterns for p in (base / "repo/results" / run).glob(pat))
    if not files:
        print(f"{run}: no {what} files to pack")
        return
    tmp = out.with_name(f"{run}-{what}{tag}.tar" + (".xz" if compress else ""))
    # (xz preset 1: a 19k-answer journal packs in seconds, not a minute of the host's time)
    with tarfile.open(tmp, "w:xz", preset=1) if compress else tarfile.open(tmp, "w") as tar:
        for p in files:
            name = str(p.relative_to(base / "repo"))
            slimmed = slim_weights(p) if slim and p.suffix == ".safetensors" else None
            if slimmed is None:
                tar.add(p, arcname=name)
                continue
            weights, ident = slimmed
            add_bytes(tar, name, weights)
            add_bytes(tar, name + ".embed.json", json.dumps(ident).encode())
    data = tmp.read_bytes()
    tmp.unlink()
    for i in range(0, len(data), LIMIT):
        (out.parent / f"{tmp.name}.part{i // LIMIT:02d}").write_bytes(data[i : i + LIMIT])
    print(f"packed {run}'s {what} ({len(files)} files) into {len(data) / 2**20:.1f} MiB of parts")


def drafter_patterns(names: list[str]) -> list[str]:
    """The files of the named drafters (all of a run's when none is named)."""
    if not names:
        return DRAFTERS
    return [f"drafter/{n}/{f}" for n in names for f in ("*.json", "*.safetensors")]


def main(
    root: str, out: str, synth_runs: list[str], drafter_runs: list[str], slim: bool = False
) -> None:
    for run in synth_runs:
        pack_parts(Path(root), run, "synth", SYNTH, Path(out), compress=True)
    for spec in drafter_runs:
        run, _, names = spec.partition(":")
        chosen = [n for n in names.split(",") if n]
        tag = "-" + "-".join(chosen) if chosen else ""
        patterns = drafter_patterns(chosen)
        pack_parts(Path(root), run, "drafters", patterns, Path(out), False, slim, tag)
    base = Path(root)
    files = sorted({p for pat in KEEP for p in base.glob(pat) if p.is_file()})
    with tarfile.open(out, "w:xz") as tar:
        for p in files:
            data = p.read_bytes()
            if p.suffix == ".log" and len(data) > LOG_TAIL:
                data = b"[... cut ...]\n" + data[-LOG_TAIL:]
            add_bytes(tar, str(p.relative_to(base)).removeprefix("repo/"), data)
    size = Path(out).stat().st_size
    print(f"packed {len(files)} files into {out}: {size / 2**20:.1f} MiB")
    if size > LIMIT:
        sys.exit(f"{out} is over {LIMIT >> 20} MiB: it will not come back")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--synth", nargs="*", default=[], metavar="RUN")
    ap.add_argument("--drafters", nargs="*", default=[], metavar="RUN[:NAME,...]")
    ap.add_argument("--slim", action="store_true", help="drafters without frozen embeddings")
    a = ap.parse_args()
    main(a.root, a.out, a.synth, a.drafters, a.slim)
