# slmserve: reproduce "Towards Pareto Optimal Throughput in Small Language Model Serving" (EuroMLSys '24)
# on vLLM. Read top to bottom: configuration, then one rule file per stage of the DAG.
#
#   snakemake all --cores 4 --resources gpu=4                     # the paper, on up to 4 GPUs
#   snakemake all --configfile config/smoke.yaml --cores 2 --resources gpu=1  # every stage on the CPU engine
#   make replot                                                   # figures from results/, no GPU job


from snakemake.utils import min_version, validate

from slmserve.config import check_schema

min_version("9.0")


configfile: "config/config.yaml"


check_schema(config, f"{workflow.basedir}/config/schemas/config.schema.yaml")  # a short message per bad key
validate(config, "config/schemas/config.schema.yaml")  # fills the defaults


report: "report/workflow.rst"


include: "rules/common.smk"


warn_unplanned()


wildcard_constraints:
    **{**WILDCARDS, "model": MODEL_RE},


include: "rules/dataset.smk"


if config["replot"]:  # re-plotting leaves every measuring rule out: results are inputs then
    check_replot()
else:

    include: "rules/capacity.smk"
    include: "rules/measure.smk"


include: "rules/summarize.smk"
include: "rules/tables.smk"
include: "rules/figures.smk"


onstart:
    check_engine_or_results()


rule all:
    input:
        all_targets(),
    default_target: True


rule demo:
    input:
        demo_targets(),


rule calibrate:
    # This machine's calibration point alone, to name first on a new machine: a calibration table that
    # exists does not pull this machine's missing point
    input:
        calibration_files(),
