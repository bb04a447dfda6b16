"""``build()``: tokenizer -> teacher turns -> distillation -> checkpoint (-> W4A16), once.

The output directory is complete or absent: everything is written beside it and moved into
place last, with ``miniature.json`` (the fingerprint, what went in, the figures of each step).
The fingerprint covers everything that decides the result: the code that builds and its chat
template, the committed teacher corpus, the pinned ShareGPT file the tokenizer learns from,
the settings, the variant and the versions of the libraries that compute it. A second build
with the same fingerprint returns the existing directory untouched.

With ``cache``, the trained bf16 text model and the tokenizer are kept under
``cache/train-<fingerprint>/`` so that the other quantization (or the other variant) of the
same training is only an export.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..prompts.sources import PACKAGED, iter_sharegpt, packaged_file
from ..runtime.files import sha256_file
from . import checkpoint, distill, teacher
from . import tokenizer as toklib
from .quantize import quantize_experts

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
VARIANTS = ("wrapper", "backbone")
QUANTIZE = ("w4a16", "none")
LIBRARIES = ("torch", "transformers", "tokenizers", "compressed-tensors", "safetensors")


@dataclass(frozen=True)
class BuildSettings:
    samples: int = 24  # teacher turns trained on (the corpus's first, in its seeded order)
    train: distill.TrainSettings = field(default_factory=distill.TrainSettings)
    tokenizer_chars: int = toklib.TRAIN_CHARS


# what decides the training (cached by its fingerprint), and what turns it into a directory
TRAIN_CODE = ("config.py", "distill.py", "teacher.py", "tokenizer.py")
EXPORT_CODE = ("build.py", "checkpoint.py", "quantize.py")


def code_digest(names: tuple[str, ...] = TRAIN_CODE, data: bool = True) -> str:
    """The package modules ``names`` (and its data files: the chat template, the corpus), by
    content. check.py and stats.py only look at a build and count for neither."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*")):
        if p.name in names or (data and p.suffix in (".jinja", ".zst")):
            h.update(str(p.relative_to(PACKAGE_DIR)).encode() + b"\0" + sha256_file(p).encode())
    return h.hexdigest()


def inputs(settings: BuildSettings) -> dict:
    """What decides the trained model (the export adds the variant and the quantization)."""
    pkg = PACKAGED["sharegpt"]
    return {
        "code": code_digest(),
        "corpus_sha256": sha256_file(teacher.CORPUS),
        "sharegpt": f"{pkg.distribution}=={pkg.version} sha256 {pkg.sha256}",
        "settings": asdict(settings),
        "libraries": {name: md.version(name) for name in LIBRARIES},
    }


def fingerprint(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def training_rows(settings: BuildSettings, tokenizer_dir: Path) -> list:
    """(prompt ids, completion ids) of the turns trained on, with the tokenizer in
    ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    shaped = [s for s in (teacher.shape(r) for r in teacher.read_corpus()) if s]
    samples = shaped[: settings.samples]
    if len(samples) < settings.samples:
        raise ValueError(f"the corpus has {len(shaped)} usable turns, {settings.samples} asked")
    return distill.render_rows(hf_tok, samples, settings.train.max_len)


def _train(settings: BuildSettings, work: Path) -> dict:
    """Tokenizer and trained bf16 text tensors (checkpoint names) in ``work``; the figures."""
    import torch
    from safetensors.torch import save_file

    figures: dict = {}
    t0, c0 = time.time(), time.process_time()
    sharegpt = iter_sharegpt(packaged_file("sharegpt"))
    tok = toklib.train(toklib.sharegpt_text(sharegpt, settings.tokenizer_chars))
    toklib.save(tok, work)
    figures["tokenizer_s"] = round(time.time() - t0, 1)
    figures["tokenizer_cpu_s"] = round(time.process_time() - c0, 1)

    t0, c0 = time.time(), time.process_time()
    rows = training_rows(settings, work)
    result = distill.train(rows, settings.train)
    figures.update(
        train_s=round(time.time() - t0, 1),
        train_cpu_s=round(time.process_time() - c0, 1),
        samples=len(rows),
        completion_tokens_per_epoch=result.tokens,
        positions_per_epoch=sum(len(p) + len(c) for p, c in rows),
        used_ids=len(result.used_ids),
        epoch_losses=[round(x, 4) for x in result.losses],
        final_loss=round(result.final_loss, 4),
    )
    text = checkpoint.text_tensors(distill.expand(result), torch.bfloat16)
    save_file(text, str(work / "text.safetensors"))
    (work / "train.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def build(
    out: str | os.PathLike,
    quantize: str = "w4a16",
    variant: str = "wrapper",
    settings: BuildSettings | None = None,
    cache: str | os.PathLike | None = None,
) -> dict:
    """Build the miniature into ``out`` (module docstring); returns its ``miniature.json``."""
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {QUANTIZE}, not {quantize!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    import torch
    from safetensors.torch import load_file

    settings = settings or BuildSettings()
    out = Path(out)
    t_start, c_start = time.time(), time.process_time()
    train_inputs = inputs(settings)
    train_fp = fingerprint(train_inputs)
    export_code = code_digest(EXPORT_CODE, data=False)
    fp = fingerprint(
        {"train": train_fp, "export": export_code, "quantize": quantize, "variant": variant}
    )
    manifest_path = out / "miniature.json"
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("fingerprint") == fp:
            log.info("%s is up to date (fingerprint %s)", out, fp)
            return old

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if cache is not None:
            work = Path(cache) / f"train-{train_fp}"
            if not (work / "train.json").exists():
                part = work.with_name(f".{work.name}.partial-{os.getpid()}")
                shutil.rmtree(part, ignore_errors=True)
                part.mkdir(parents=True)
                _train(settings, part)
                shutil.rmtree(work, ignore_errors=True)
                os.replace(part, work)
            train_figures = json.loads((work / "train.json").read_text())
            train_figures["cached"] = True
        else:
            work = tmp / ".train"
            work.mkdir()
            train_figures = _train(settings, work)

        t0, c0 = time.time(), time.process_time()
        text = checkpoint.silence_unwritten_ids(
            load_file(str(work / "text.safetensors")), training_rows(settings, work)
        )
        tensors = checkpoint.checkpoint_tensors(
            text, variant == "wrapper", settings.train.seed, torch.bfloat16
        )
        quant_figures = None
        if quantize == "w4a16":
            tensors, quant_figures = quantize_experts(tensors)
        checkpoint.write_model_dir(tmp, tensors, variant == "wrapper", quantize == "w4a16")
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(work / name, tmp / name)
        export_s = round(time.time() - t0, 1)
        export_cpu_s = round(time.process_time() - c0, 1)
        shutil.rmtree(tmp / ".train", ignore_errors=True)
        manifest = {
            "fingerprint": fp,
            "train_fingerprint": train_fp,
            "variant": variant,
            "quantize": quantize,
            "inputs": train_inputs,
            "figures": {
                **train_figures,
                "export_s": export_s,
                "export_cpu_s": export_cpu_s,
                "quantization": quant_figures,
                "build_s": round(time.time() - t_start, 1),
                "build_cpu_s": round(time.process_time() - c_start, 1),
            },
        }
        (tmp / "miniature.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
