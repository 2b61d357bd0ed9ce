# Stage 2: measured runs. One job = one model on `tp` GPUs with one workload and every batch size of
# the sweep; it takes its GPUs by lock (slmserve.gpuslots) and starts and stops its own vLLM server(s).
# Naming: <outdir>/runs/{model}/tp{tp}-out{output_len}-rate{req/s|inf}/bs{batch}.{requests,telemetry}.parquet


rule sweep:
    input:
        prompts=prompts_file(),
    output:
        requests=expand(f"{RUN_PATTERN}/bs{{bs}}.requests.parquet", bs=SWEEP["batch_sizes"]),
        telemetry=expand(f"{RUN_PATTERN}/bs{{bs}}.telemetry.parquet", bs=SWEEP["batch_sizes"]),
    params:
        job=sweep_job,
    resources:
        gpu=lambda w: int(w.tp),
    log:
        f"{LOGS}/runs/{{model}}/tp{{tp}}-out{{out}}-rate{{rate}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_sweep.py"
