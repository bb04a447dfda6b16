"""The training process: speculators' own trainer, on the CPU or under torchrun.

    python -m eagle3_pipeline.train.entry JOB.json                    # CPU, one process
    torchrun --standalone --nproc-per-node N -m eagle3_pipeline.train.entry JOB.json
    python -m eagle3_pipeline.train.entry --stock METRICS.jsonl -- <speculators train flags>

``JOB.json`` (written by :func:`eagle3_pipeline.train.run`) holds the flat speculators
``TrainConfig`` fields, the hidden-states backend args and where to write metric records. The
process applies :func:`apply_bridges`, registers our hidden-states backend
(:mod:`eagle3_pipeline.hidden_states.dataset`), attaches file loggers and calls
``speculators.train.cli.main(TrainConfig)``: the model, dataset, loss, checkpointing and resume
logic are speculators' own; there is no second training loop. ``--stock`` resolves the config
from stock ``speculators train`` flags instead (used by the throughput benchmark to compare with
the stock CLI under identical bridges and probes).

Records (one JSON object a line, rank 0 only, flushed per line so a killed run keeps them):
``start`` (attempt, bridges, devices), ``hparams`` (the resolved config), ``train`` (every
``log_freq`` steps: speculators' metrics + its step profile), ``val`` (per epoch), ``loader``
(per training batch: seconds the trainer waited for the DataLoader) and ``end`` (peak GPU
memory). Nothing heavy is imported at import time (the package's other modules import only the
standard library and zstandard), so it runs on a bare GPU machine with only torch,
transformers, speculators and zstandard installed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3_pipeline.runtime.files import AppendLog

log = logging.getLogger("eagle3_pipeline.train.entry")  # __name__ is __main__ under -m


# ---- device bridges ------------------------------------------------------------------------


def apply_bridges(accelerator: bool | None = None) -> list[str]:
    """Bridge the device assumptions of speculators 0.9's trainer. The only behavioural patches.

    Without an accelerator (CPU training) speculators' ``Trainer`` assumes one in four places,
    five with several processes; each is redirected to the CPU, nothing else changes:

    1. ``trainer.get_local_rank()`` -> ``"cpu"``: the trainer moves the model and every batch
       with ``.to(self.local_rank)``; rank 0 would mean ``cuda:0``.
    2. ``torch.accelerator.synchronize`` -> no-op: the step timer synchronizes on logged steps
       and raises "Cannot access accelerator device when none is available".
    3. ``DataLoader(pin_memory=True)`` -> ``pin_memory=False``: pinning needs an accelerator.
    4. ``checkpointer.get_current_device()`` -> ``"cpu"``: without an accelerator it returns
       ``"cuda:0"`` as the map location, so resuming from a checkpoint failed.
    5. Under torchrun only: ``cli.maybe_setup_distributed`` -> a gloo process group. Upstream
       selects an accelerator device first ("Cannot access accelerator device when none is
       available"); the trainer's DDP path then runs unchanged on CPU processes.

    With an accelerator one fix is applied: on an H200 (torch 2.11, triton 3.6) the fused loss
    crashed at step 0 under torch.compile because one ``triton.autotune`` decorator is applied to
    both loss kernels, which then share its ``configs``/``keys`` lists ("ListVariable ... is
    already tracked for mutation"). ``loss_backward_kernel`` gets its own deep copies of the two
    lists; the math is unchanged. The upstream lines of all six: docs/dependencies.md.

    On any device, speculators resolves the draft's mask token from the target's
    ``AutoProcessor``, of which it reads the tokenizer alone; a multimodal target's processor
    (Kimi-K2.5's ``kimi_k25``) also wants its image processor, which needs torchvision. Where the
    processor cannot be built, the tokenizer stands in for it (:func:`_bridge_text_processor`).

    Returns the names of the bridges applied (recorded in the ``start`` record).
    """
    import copy
    import functools

    import torch

    if accelerator is None:
        accelerator = torch.accelerator.is_available()
    applied: list[str] = []
    if not accelerator:
        import speculators.train.checkpointer as checkpointer_mod
        import speculators.train.dataloader as dataloader_mod
        import speculators.train.trainer as trainer_mod

        trainer_mod.get_local_rank = lambda: "cpu"
        applied.append("local_rank->cpu")

        torch.accelerator.synchronize = lambda *args, **kwargs: None
        applied.append("accelerator.synchronize->noop")

        if not getattr(dataloader_mod.DataLoader, "_eagle3_unpinned", False):
            original = dataloader_mod.DataLoader

            @functools.wraps(original, updated=())
            def unpinned(*args, **kwargs):
                kwargs["pin_memory"] = False
                return original(*args, **kwargs)

            unpinned._eagle3_unpinned = True
            dataloader_mod.DataLoader = unpinned
        applied.append("DataLoader.pin_memory->False")

        checkpointer_mod.get_current_device = lambda: "cpu"
        applied.append("checkpointer.device->cpu")

        if "LOCAL_RANK" in os.environ:  # under torchrun: several CPU processes
            _bridge_distributed_setup()
            applied.append("distributed.setup->gloo")
    else:
        try:
            import speculators.losses.fused as fused
        except ImportError:  # no triton: only the eager loss is usable anyway
            fused = None
        kernel = getattr(fused, "loss_backward_kernel", None)
        if kernel is not None and hasattr(kernel, "configs"):
            kernel.configs = copy.deepcopy(kernel.configs)
            if hasattr(kernel, "keys"):
                kernel.keys = copy.deepcopy(kernel.keys)
            applied.append("fused_loss.backward_autotune_lists->own_copies")
    _bridge_text_processor()
    applied.append("load_processor->tokenizer_if_no_processor")
    return applied


def _bridge_text_processor() -> None:
    """The target's tokenizer where its processor cannot be built (the mask token resolution,
    ``speculators.train.utils.resolve_mask_token_id``, reads only the tokenizer)."""
    import speculators.train.utils as utils_mod

    original = utils_mod.load_processor
    if getattr(original, "_eagle3_text_fallback", False):
        return

    def load_processor(path, *, trust_remote_code: bool = False):
        try:
            return original(path, trust_remote_code=trust_remote_code)
        except (ValueError, ImportError, OSError) as err:
            from transformers import AutoTokenizer

            log.info("the target's processor cannot be built (%s): its tokenizer instead", err)
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            return tokenizer

    load_processor._eagle3_text_fallback = True
    utils_mod.load_processor = load_processor


def _bridge_distributed_setup() -> None:
    """Bridge 5: a gloo default group, then the topology state speculators' getters read (ranks,
    SP/DP groups), filled as upstream fills it."""
    import speculators.train.cli as cli_mod
    import speculators.train.distributed as dist_mod
    import torch.distributed as dist

    def setup_gloo(sp_size: int = 1) -> None:
        dist.init_process_group("gloo")
        dist_mod._local_rank = int(os.environ["LOCAL_RANK"])
        dist_mod._is_distributed = True
        dist_mod._rank = dist.get_rank()
        dist_mod._world_size = dist.get_world_size()
        dist_mod._init_sp_process_groups(dist_mod._rank, dist_mod._world_size, sp_size)

    cli_mod.maybe_setup_distributed = setup_gloo


# ---- records -------------------------------------------------------------------------------


class RecordWriter:
    """Appends JSON records to ``path`` (rank 0 only), one flushed line each."""

    def __init__(self, path: str | Path | None, attempt: int, rank: int):
        self.attempt = attempt
        self._log = AppendLog(path, default=_jsonable) if path is not None and rank == 0 else None
        if self._log is not None:
            self._log.open()

    @property
    def enabled(self) -> bool:
        return self._log is not None

    def write(self, kind: str, payload: Mapping[str, Any], t: float | None = None) -> None:
        if self._log is not None:
            self._log.append(
                {
                    "kind": kind,
                    "t": time.time() if t is None else t,
                    "attempt": self.attempt,
                    **payload,
                }
            )

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        try:
            return x.item()
        except (ValueError, RuntimeError):
            pass
    return str(x)


class MetricsHandler(logging.Handler):
    """Turns speculators' metric-logger dicts (``speculators.metrics``) into records."""

    def __init__(self, writer: RecordWriter):
        super().__init__(logging.INFO)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("speculators.metrics"):
            return
        msg = record.msg
        if not isinstance(msg, Mapping):
            return
        try:
            if getattr(record, "hparams", False):
                self.writer.write("hparams", {"config": dict(msg)}, t=record.created)
            elif "train" in msg:
                self.writer.write("train", dict(msg), t=record.created)
            elif "val" in msg:
                self.writer.write("val", dict(msg), t=record.created)
        except Exception:
            self.handleError(record)


class ConsoleFormatter(logging.Formatter):
    """Plain one-line log format; metric dicts flattened to ``key=value`` pairs (the record
    itself is not modified, so the metrics handler still sees the dict)."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, Mapping):
            if getattr(record, "hparams", False):
                text = "resolved train config logged (hparams record)"
            else:
                text = ", ".join(f"{k}={_short(v)}" for k, v in _flatten(record.msg).items())
            record = logging.makeLogRecord({**record.__dict__, "msg": text, "args": None})
        return super().format(record)


def _flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3e}" if v and (abs(v) < 1e-3 or abs(v) > 1e4) else f"{v:.4f}"
    return str(v)


def setup_logging(writer: RecordWriter, rank: int) -> None:
    """Root handlers installed before speculators' ``setup_root_logger`` (whose
    ``basicConfig`` then adds nothing): plain lines on stderr (rank 0, plus records speculators
    marks ``override_rank0_filter``) and metric records to the writer."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(ConsoleFormatter())
    console.addFilter(lambda r: rank == 0 or getattr(r, "override_rank0_filter", False))
    root.addHandler(console)
    root.addHandler(MetricsHandler(writer))


# ---- probes (measurement only; training is unchanged) ---------------------------------------


class TimedLoader:
    """Wraps the training DataLoader and records how long each ``next()`` blocked: the time
    the trainer waited for data. Everything else is delegated (len, batch_sampler, ...)."""

    def __init__(self, loader, writer: RecordWriter):
        self._loader = loader
        self._writer = writer
        self._epoch_iter = -1

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __iter__(self):
        self._epoch_iter += 1
        it = iter(self._loader)
        i = 0
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            wait = time.perf_counter() - t0
            self._writer.write("loader", {"iter": self._epoch_iter, "i": i, "wait_s": wait})
            i += 1
            yield batch


def install_loader_probe(writer: RecordWriter) -> None:
    import speculators.train.cli as cli_mod

    original = cli_mod.create_train_val_loaders
    if getattr(original, "_eagle3_probe", False):
        return

    def create_train_val_loaders(*args, **kwargs):
        train_loader, val_loader = original(*args, **kwargs)
        return TimedLoader(train_loader, writer), val_loader

    create_train_val_loaders._eagle3_probe = True
    cli_mod.create_train_val_loaders = create_train_val_loaders


def device_summary(writer: RecordWriter) -> dict[str, Any]:
    """Device facts for the records; only where records are written (rank 0), so that no other
    rank touches a CUDA device before speculators selects its own."""
    if not writer.enabled:
        return {}
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "accelerator": torch.accelerator.is_available(),
    }
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name()
        info["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        info["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return info


# ---- config --------------------------------------------------------------------------------


def build_config(job: Mapping[str, Any]):
    """speculators' ``TrainConfig`` from the job's flat fields (+ backend args)."""
    from speculators.train.config import TrainConfig
    from speculators.train.config.schema import CONFIG_DESTS

    flat = dict(job["train_config"])
    unknown = sorted(set(flat) - CONFIG_DESTS)
    if unknown:  # TrainConfig ignores unknown keys silently; a typo must not
        raise SystemExit(
            f"unknown speculators TrainConfig field(s) {unknown} (from train.extra_args?)"
        )
    argv = ["eagle3_pipeline.train.entry", str(job.get("job_path", ""))]
    return TrainConfig.from_sources(
        cli=flat, argv=argv, backend_cli=dict(job.get("backend_args") or {})
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    if argv and argv[0] == "--stock":
        if len(argv) < 3 or argv[2] != "--":
            raise SystemExit(
                "usage: python -m eagle3_pipeline.train.entry --stock METRICS.jsonl -- "
                "<speculators flags>"
            )
        job = {"metrics_path": argv[1], "attempt": 1}
        stock_argv = argv[3:]
    elif len(argv) == 1:
        job = json.loads(Path(argv[0]).read_text())
        job["job_path"] = argv[0]
        stock_argv = None
    else:
        raise SystemExit(__doc__)

    writer = RecordWriter(job.get("metrics_path"), int(job.get("attempt", 1)), rank)
    setup_logging(writer, rank)

    bridges = apply_bridges()
    from eagle3_pipeline.hidden_states import dataset as hs_backend
    from eagle3_pipeline.online import transfer as online_backend

    hs_backend.register()
    online_backend.register()
    if stock_argv is not None:
        from speculators.train.config import TrainConfig

        cfg = TrainConfig.resolve(stock_argv)
    else:
        cfg = build_config(job)
    install_loader_probe(writer)
    writer.write(
        "start",
        {
            "pid": os.getpid(),
            "rank": rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "bridges": bridges,
            "mode": "stock" if stock_argv is not None else "pipeline",
            "resume_from": job.get("resume_from"),
            **device_summary(writer),
        },
    )
    log.info("training with speculators' trainer; bridges: %s", ", ".join(bridges) or "none")

    from speculators.train.cli import main as speculators_main

    ok = False
    try:
        speculators_main(cfg)
        ok = True
    finally:
        writer.write("end", {"ok": ok, **device_summary(writer)})
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
