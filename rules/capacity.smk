# KV-cache capacity per model (Table 1): one short server start each, with the paper's budget emulated
# (e.g. 36 GB = 90% of a 40 GB A100) and with the whole GPU (the configured share).


rule kv_probe:
    output:
        L.capacity(),
    params:
        job=lambda w: job_params(w.model, batch_control=None),
        budget=lambda w: None if w.budget == "whole" else float(w.budget.removesuffix("gb")),
    resources:
        gpu=1,
    log:
        f"{LOGS}/capacity/{{model}}-{{budget}}.log",
    conda:
        "../envs/engine.yaml"
    script:
        "../workflow/scripts/kv_probe.py"
