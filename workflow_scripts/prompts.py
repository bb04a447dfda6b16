"""Rules `prompts_train` and `prompts_bench`: the training pool or one benchmark set
(logic: eagle3_pipeline.prompts), without the prompts too long for the target's context
(logic: eagle3_pipeline.target.chat)."""

from eagle3_pipeline import prompts
from eagle3_pipeline.config import job_section, self_written_names
from eagle3_pipeline.runtime import run_job
from eagle3_pipeline.target.chat import context_limit


def job(i, o, p, log):
    section = job_section(snakemake.config, p.config, "prompts")
    vllm = job_section(snakemake.config, p.config, "vllm")
    # what the requests of the stage that reads these prompts leave for a prompt
    answers = "synth" if snakemake.rule == "prompts_train" else "bench"
    asked = job_section(snakemake.config, p.config, answers)
    context = context_limit(
        i.target,
        vllm["max_model_len"],
        f"{answers}.max_tokens",
        asked["max_tokens"],
        asked.get("chat_template_kwargs") or {},
    )
    if snakemake.rule == "prompts_train":
        names = self_written_names(snakemake.config)
        written = {
            name: {"rows": rows, "stats": stats}
            for name, rows, stats in zip(names, i.written, i.written_stats, strict=True)
        }
        prompts.build_train(
            section,
            train_out=o.train,
            stats_out=o.stats,
            heldout_out=o.get("heldout"),
            heldout_stats_out=o.get("heldout_stats"),
            context=context,
            written=written,
        )
    else:
        [spec] = section["bench"]
        prompts.build_bench(section, spec, out=o.prompts, stats_out=o.stats, context=context)


run_job(snakemake, job)
