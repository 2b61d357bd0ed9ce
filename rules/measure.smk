# Measured runs. Every job takes its GPUs by lock (slmserve.gpuslots) and starts and stops its own
# vLLM server(s). Inputs it only reads at start (prompts, capacity) are ancient(): a checkout's file
# times never make finished measurements look stale; a finished job does not even list the prompts,
# so rebuilding them (a fresh clone) re-runs nothing (prompts_unless_done).
# File names: slmserve.layout.TEMPLATES.


rule calibration:
    # This machine's calibration point (slmserve.calibration): the first job to start on it (priority); with
    # --resources gpu=1 it runs alone, with more GPUs other jobs may start beside it on the others.
    input:
        prompts=ancient(lambda w: prompts_unless_done([L.path("calibration", **w)])),
    output:
        requests=L.path("calibration"),
        telemetry=L.path("calibration_telemetry"),
    params:
        job=calibration_job,
        prompts=PROMPTS,
    priority: 100
    resources:
        gpu=1,
    log:
        f"{LOGS}/calibration/{{machine}}/{{model}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_sweep.py"


rule sweep:
    # One model on `tp` GPUs, every batch size (Figures 1, 3, 4, 8; families of Figure 2 left).
    input:
        prompts=ancient(lambda w: prompts_unless_done(expand(L.path("run", **w), bs=SWEEP["batch_sizes"]))),
    output:
        requests=expand(L.path("run"), bs=SWEEP["batch_sizes"], allow_missing=True),
        telemetry=expand(L.path("run_telemetry"), bs=SWEEP["batch_sizes"], allow_missing=True),
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
        prompts=ancient(lambda w: prompts_unless_done(points(model=w.model))),
        capacity=ancient(get_server_probe()),
    output:
        requests=points(),
        telemetry=points("point_telemetry"),
    params:
        job=lambda w: job_params(w.model, batch_control=None, requests=True),
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
        prompts=ancient(lambda w: prompts_unless_done([L.path("replication", **w)])),
        capacity=ancient(get_server_probe()),
    output:
        requests=L.path("replication"),
        telemetry=L.path("replication_telemetry"),
    params:
        job=lambda w: job_params(w.model, batch_control=None),
        prompts=PROMPTS,
    resources:
        gpu=1,
    log:
        f"{LOGS}/replication/{{model}}_r{{n}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_replication.py"


rule replication_plan:
    # Beyond the paper: the batching advisor's plan (its replicas x its chosen batch, memory split evenly),
    # plain or under MPS, beside Figures 5-7's equal split; the advisor runs on the model's one-GPU sweep.
    input:
        prompts=ancient(lambda w: prompts_unless_done([L.path("plan", **w)])),
        capacity=ancient(get_server_probe()),
        sweep=ancient(lambda w: run_files(w.model, 1, SWEEP["batch_sizes"])),
        budget=ancient(lambda w: advisor_probes(BUDGET, [w.model]) if BUDGET else []),
    output:
        requests=L.path("plan"),
        telemetry=L.path("plan_telemetry"),
    params:
        job=lambda w: job_params(w.model, batch_control=None),
        prompts=PROMPTS,
        models=config["models"],
        advisor=EXP["advisor"],
    resources:
        gpu=1,
    log:
        f"{LOGS}/replication/{{model}}_advisor-{{variant}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/run_replication.py"
