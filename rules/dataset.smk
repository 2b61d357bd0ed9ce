# Stage 1: ShareGPT prompts, tokenized and truncated to the workload's input length.


rule prepare_dataset:
    output:
        L.path("prompts"),
    params:
        dataset=config["dataset"],
        workload=lambda w: {"input_len": int(w.input_len), "num_requests": int(w.num_requests)},
    log:
        f"{LOGS}/prepare_dataset-in{{input_len}}-n{{num_requests}}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow/scripts/prepare_dataset.py"
