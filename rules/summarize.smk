# Stage 3: telemetry merge. Each run's telemetry is cut to its measurement window (first send to last
# end) and joined to its request metrics: one row per run in a summary parquet per experiment.


rule summarize_sweep:
    input:
        runs=sweep_runs(),
    output:
        f"{OUT}/summary/sweep.parquet",
    log:
        f"{LOGS}/summary/sweep.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/summarize.py"
