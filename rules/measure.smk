# Measured runs. Every job takes its GPUs by lock (slmserve.gpuslots) and starts and stops its own
# vLLM server(s). Inputs it only reads at start (prompts, capacity) are ancient(): a checkout's file
# times never make finished measurements look stale; a finished job does not even list the prompts,
# so rebuilding them (a fresh clone) re-runs nothing (prompts_unless_done).
# Naming: <outdir>/runs/{model}/tp{tp}-out{output_len}-rate{req/s|inf}/bs{batch}.{requests,telemetry}.parquet


rule sweep:
    # One model on `tp` GPUs, every batch size (Figures 1, 3, 4, 8; families of Figure 2 left).
    input:
        prompts=ancient(
            lambda w: prompts_unless_done(
                [f"{RUN.format(**w)}/bs{bs}.requests.parquet" for bs in SWEEP["batch_sizes"]]
            )
        ),
    output:
        requests=expand(f"{RUN_PATTERN}/bs{{bs}}.requests.parquet", bs=SWEEP["batch_sizes"]),
        telemetry=expand(f"{RUN_PATTERN}/bs{{bs}}.telemetry.parquet", bs=SWEEP["batch_sizes"]),
    params:
        job=sweep_job,
        prompts=PROMPTS,
    resources:
        gpu=lambda w: int(w.tp),
    log:
        f"{LOGS}/runs/{{model}}/tp{{tp}}-out{{out}}-rate{{rate}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_sweep.py"


rule output_lengths:
    # Figure 2 right: one model at its one-GPU maximum batch, every output length x arrival rate, on one
    # server (same server configuration for all points).
    input:
        prompts=ancient(lambda w: prompts_unless_done(point_files(w.model))),
        capacity=ancient(f"{OUT}/capacity/{{model}}-whole.json"),
    output:
        requests=[f"{stem}.requests.parquet" for stem in point_stems("{model}")],
        telemetry=[f"{stem}.telemetry.parquet" for stem in point_stems("{model}")],
    params:
        job=lambda w: job_params(w.model),
        prompts=PROMPTS,
        points=[(o, parse_rate(r)) for o in OUTLEN["output_lens"] for r in OUTLEN["arrival_rates"]],
    resources:
        gpu=1,
    log:
        f"{LOGS}/points/{{model}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_points.py"


rule replication:
    # Figures 5-7: n replicas on one GPU, memory and requests split evenly, batch = one-GPU max / n.
    input:
        prompts=ancient(lambda w: prompts_unless_done([f"{OUT}/replication/{w.model}_r{w.n}.parquet"])),
        capacity=ancient(f"{OUT}/capacity/{{model}}-whole.json"),
    output:
        requests=f"{OUT}/replication/{{model}}_r{{n}}.parquet",
        telemetry=f"{OUT}/replication/{{model}}_r{{n}}.telemetry.parquet",
    params:
        job=lambda w: job_params(w.model),
        prompts=PROMPTS,
    resources:
        gpu=1,
    log:
        f"{LOGS}/replication/{{model}}_r{{n}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_replication.py"
