"""Train stage: an EAGLE-3 drafter with speculators' own trainer, exported for vLLM.

One code path for every device. :func:`run` (:mod:`.stage`) maps the ``train`` config onto
speculators' ``TrainConfig`` fields (:mod:`.trainer_config`, pure), writes a job file into
``work_dir`` and starts the training process (:mod:`.entry`, via :mod:`.launcher`): plain
``python -m`` on the CPU, ``torchrun --nproc-per-node train.gpus`` on GPUs. speculators'
``Trainer`` does the training, checkpoints into ``work_dir/checkpoints`` and resumes from the
newest checkpoint there.

``work_dir`` is not a declared output, so it survives a failed or killed job:

    work_dir/fingerprint.json     inputs + parameters of the checkpoints below (.fingerprint);
                                  a mismatch wipes them
    work_dir/job.json             the job the training process runs
    work_dir/checkpoints/<epoch>/ speculators checkpoints (mid-epoch ones too), checkpoint_best
                                  link (.checkpoints)
    work_dir/logs/metrics.jsonl   records of every attempt (written by .entry, read by .metrics)

Before each launch torn checkpoints (a kill during a save) are removed, so speculators resumes
from the last complete one. After training the best checkpoint (lowest validation loss) is
exported to ``drafter_dir`` with the verifier path made absolute (.export), and
``metrics.json`` (per-epoch losses and per-TTT-step accuracies, throughput, resume history,
train/serve consistency record from :mod:`eagle3_pipeline.methods.consistency`) and ``loss.png``
(.plot) are written.
"""

from .errors import TrainError
from .stage import run

__all__ = ["TrainError", "run"]
