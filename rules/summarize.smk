# Telemetry merge. Each run's telemetry is cut to its measurement window (first send to last end) and
# joined to its request metrics: one row per run in a summary parquet per experiment (slmserve.layout.
# EXPERIMENTS).


rule summarize:
    localrule: True
    input:
        runs=lambda w: measured(experiment_runs(w.experiment)),
    output:
        L.path("summary"),
    params:
        models=config["models"],
        planned=lambda w: experiment_runs(w.experiment),
    log:
        f"{LOGS}/summary/{{experiment}}.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/summarize.py"
