"""Snakemake ``script:`` of the dataset rule: ShareGPT prompts -> parquet (see slmserve.dataset)."""

import contextlib
import logging
import sys

with (
    open(snakemake.log[0], "w", buffering=1) as log,
    contextlib.redirect_stdout(log),
    contextlib.redirect_stderr(log),
):
    logging.basicConfig(
        stream=log, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.captureWarnings(True)  # TruncatedDatasetWarning goes to the log, and to the console:
    console = logging.StreamHandler(sys.__stderr__)
    console.setFormatter(logging.Formatter("prepare_dataset: %(message)s"))
    logging.getLogger("py.warnings").addHandler(console)
    from slmserve import dataset  # imported here so that library logging binds to the log file

    ds, wl = dict(snakemake.params.dataset), dict(snakemake.params.workload)
    try:
        meta = dataset.build(
            ds["source"],
            snakemake.output[0],
            path=ds.get("path"),
            hub_id=ds.get("hub_id"),
            tokenizer=ds.get("tokenizer") or dataset.OFFLINE_TOKENIZER,
            input_len=int(wl["input_len"]),
            num_requests=int(wl["num_requests"]),
            seed=int(ds["seed"]),
            cfg={"dataset": ds, "workload": wl},
        )
    except Exception:
        logging.exception("dataset preparation failed")
        raise
    print(dataset.summary(meta))
