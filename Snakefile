# EAGLE-3 drafter pipeline: synth -> prepare/vocab -> extract -> train -> bench -> report.
# Thin on purpose: the stages live in rules/, their logic in src/eagle3_pipeline/.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"


report: "report/workflow.rst"


rule all:
    default_target: True
    input:
        final_targets(),
        INTERRUPTED,


include: "rules/target.smk"
include: "rules/prompts.smk"
include: "rules/synth.smk"
include: "rules/prepare.smk"
include: "rules/vocab.smk"
include: "rules/extract.smk"
include: "rules/train.smk"
include: "rules/bench.smk"
include: "rules/report.smk"


# rule names on the command line (--until, --omit-from, -R) must name rules defined above
check_command_line()
