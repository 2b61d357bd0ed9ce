# slmserve: reproduce "Towards Pareto Optimal Throughput in Small Language Model Serving" (EuroMLSys '24)
# on vLLM. Read top to bottom: configuration, then one rule file per stage of the DAG.
#
#   snakemake --cores 4 --resources gpu=4 all                      # the paper, on up to 4 GPUs
#   snakemake --configfile config/smoke.yaml --cores 2 all         # the CPU smoke run (make demo)

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "config/schemas/config.schema.yaml")


include: "rules/common.smk"


wildcard_constraints:
    model=MODEL_RE,
    tp=r"\d+",
    out=r"\d+",
    rate=r"inf|\d+(\.\d+)?",
    bs=r"\d+",


include: "rules/dataset.smk"
include: "rules/measure.smk"
include: "rules/summarize.smk"
include: "rules/figures.smk"


rule all:
    input:
        all_targets(),
    default_target: True
