# Helpers shared by all stages (config checks, the runs each experiment plans, target lists). Paths come
# from slmserve.layout (L); the experiments and figures are its EXPERIMENTS and FIGURES.

import re
from pathlib import Path

from slmserve.config import ConfigError, check, model_workload, parse_rate
from slmserve.layout import EXPERIMENTS, FIGURE_EXTS, FIGURES, WILDCARDS, Layout

check(config, Path(workflow.basedir))

L = Layout(config["outdir"], config["figdir"])
PROFILE = config["profile"]
LOGS = f"logs/{PROFILE}"
WL = config["workload"]
EXP = config["experiments"]
SWEEP = EXP["sweep"]
OUTLEN = EXP["output_lengths"]
BUDGET = EXP["table1"]["budget_gb"]
PROMPTS = L.path("prompts", input_len=WL["input_len"], num_requests=WL["num_requests"])
CAL = config["calibration"]
# The model wildcard takes a model key of the config, literally.
MODEL_RE = "|".join(map(re.escape, config["models"]))


def run_files(model, tp, batch_sizes, out=None, rate=None):
    """Requests parquet of each batch size of one sweep job (the workload's output length and rate by default)."""
    out = WL["output_len"] if out is None else out
    rate = parse_rate(WL["arrival_rate"] if rate is None else rate)
    return [L.path("run", model=model, tp=tp, out=out, rate=rate, bs=bs) for bs in batch_sizes]


def points(kind="point", model="{model}"):
    """Each (output length, arrival rate) point of one model (Figure 2 right): its requests or telemetry."""
    return [
        L.path(kind, model=model, tp=1, out=out, rate=parse_rate(rate))
        for out in OUTLEN["output_lens"]
        for rate in OUTLEN["arrival_rates"]
    ]


def experiment_runs(experiment):
    """The run files a summary is made of."""
    if experiment == "sweep":
        return [f for m in SWEEP["models"] for tp in SWEEP["tensor_parallel"] for f in run_files(m, tp, SWEEP["batch_sizes"])]
    if experiment == "families":
        return [f for m in EXP["families"]["models"] for f in run_files(m, 1, SWEEP["batch_sizes"])]
    if experiment == "output_lengths":
        return points(model=OUTLEN["model"])
    if experiment == "replication":
        rep = EXP["replication"]
        return [L.path("replication", model=m, n=n) for m in rep["models"] for n in rep["replicas"]] + plan_files()
    raise ValueError(f"unknown experiment {experiment!r}")


def plan_files():
    """The batching advisor's plan of each replication model, once per variant (plain, mps)."""
    rep = EXP["replication"]
    return [L.path("plan", model=m, variant=v) for m in rep["models"] for v in rep["advisor_plan"]["variants"]]


def measured(files):
    """What a summary or table is made of: every planned file, or with replot=True only those already
    there (the rest appear as "not measured yet" in the summary and the captions)."""
    return [f for f in files if Path(f).exists()] if config["replot"] else list(files)


def prompts_unless_done(results):
    """The prompts as input of a measuring job, or nothing once all its ``results`` are there: prompts
    rebuilt later (a fresh clone does not carry them) must not re-run finished measurements, and ancient()
    ignores file times, not an upstream job that runs."""
    return [] if all(Path(f).exists() for f in results) else [PROMPTS]


def experiments():
    """Experiments with at least one run in this configuration; when re-plotting, with at least one result
    (a profile whose results hold only Table 1's probes re-plots only Table 1)."""
    return [e for e in EXPERIMENTS if measured(experiment_runs(e))]


def warn_unplanned():
    """Name the figures that `all` leaves out because their experiment plans no run (e.g. models: [])."""
    for e in EXPERIMENTS:
        if not experiment_runs(e):
            names = ", ".join(name for name, fig in FIGURES.items() if fig.source == e)
            logger.warning(f"config: experiments.{e} plans no run, so `all` builds none of its figures: {names}")


def figures():
    return [name for name, fig in FIGURES.items() if fig.source in experiments()]


def get_server_probe():
    """The KV-cache probe of the memory every server of this config gets: the whole GPU's configured share,
    or engine.memory_budget_gb where the config emulates a smaller GPU (Table 1's probe of that budget)."""
    gb = config["engine"]["memory_budget_gb"]
    return L.capacity(budget=gb if gb else "whole")


def capacity_files(budget):
    return [L.capacity(m, budget) for m in EXP["table1"]["models"]]


def advisor_probes(budget, models=None):
    """The KV-cache probes of the sweep's models (or of ``models``) that Table 1 probes anyway (the advisor's
    memory figures; a model without one gets the analytic figures only): the advisor plans no GPU job of its own."""
    return [L.capacity(m, budget) for m in (SWEEP["models"] if models is None else models)
            if m in EXP["table1"]["models"]]


def job_params(model, tp=1, out=None, rate=None, batch_sizes=(), batch_control=True, requests=False):
    """Arguments of slmserve.runner.SweepJob; without the batch control (``batch_control=None``) for the jobs
    it does not change (probes, replication), so that changing it reruns none of them. The model's own
    request counts (models.<name>.workload) only with ``requests=True``: for the jobs whose counts depend on
    the batch (sweeps, output lengths); the others (probes, replication, calibration, which must be the same
    point on every machine) keep the workload's, and their params do not change with it."""
    entry = config["models"][model]
    eng, tel = config["engine"], config["telemetry"]
    wl = model_workload(config, model) if requests else WL
    out = int(WL["output_len"] if out is None else out)
    if WL["input_len"] + out > eng["max_model_len"]:  # check() covers the config's lengths, not a target's
        raise ConfigError(
            f"a target's output length {out}: input_len + output_len = {WL['input_len'] + out} tokens exceed "
            f"engine.max_model_len {eng['max_model_len']}; ask for out<={eng['max_model_len'] - WL['input_len']} "
            "or raise engine.max_model_len"
        )
    return {
        "model": model,
        "model_path": entry.get("weights") or entry["config"],
        "load_format": "auto" if entry.get("weights") else "dummy",
        "tensor_parallel": int(tp),
        "batch_sizes": list(batch_sizes),
        "input_len": WL["input_len"],
        "output_len": out,
        "num_requests": WL["num_requests"],
        "rounds_per_batch": wl["rounds_per_batch"],
        "min_requests": wl["min_requests"],
        "arrival_rate": parse_rate(WL["arrival_rate"] if rate is None else rate),
        "warmup_requests": WL["warmup_requests"],
        "seed": config["dataset"]["seed"],
        "telemetry_interval_s": tel["interval_ms"] / 1000,
        "telemetry_enabled": tel["enabled"],
        "profile": PROFILE,
        # only when set: a new key would make Snakemake's params trigger re-run finished jobs
        **({"engine_args": list(entry["engine_args"])} if entry.get("engine_args") else {}),
        **({"repeats": WL["repeats"], "repeat_budget_s": WL["repeat_budget_s"]} if WL["repeats"] > 1 else {}),
        **({"max_cudagraph_capture_size": eng["max_cudagraph_capture_size"]}
           if eng["max_cudagraph_capture_size"] else {}),
        **({"batch_control": eng["batch_control"]} if batch_control else {}),
        **{k: eng[k] for k in ("memory_share", "memory_budget_gb", "max_model_len", "dtype", "startup_timeout_s",
                               "cpu_kv_cache_gb", "stream_interval", "fits")},
    }  # fmt: skip


def sweep_job(wildcards):
    w = wildcards
    return job_params(w.model, w.tp, w.out, w.rate, SWEEP["batch_sizes"], requests=True)


def calibration_job(wildcards):
    """One point: the model at the calibration batch on one GPU, with the calibration's repeats; the whole
    GPU's share even where the profile emulates a smaller GPU, so that every machine's point is the same."""
    job = job_params(wildcards.model, batch_sizes=[CAL["batch_size"]])
    return {**job, "repeats": CAL["repeats"], "repeat_budget_s": None, "memory_budget_gb": None}


_machine = []


def machine():
    """This machine's name in calibration files: calibration.machine, or with "auto" slmserve.machine's."""
    if CAL["machine"] != "auto":
        return CAL["machine"]
    if not _machine:
        from slmserve.machine import machine_id

        _machine.append(machine_id())
    return _machine[0]


def calibration_files():
    """This machine's calibration point (none when re-plotting or without calibration models)."""
    if config["replot"] or not CAL["models"]:
        return []
    return [L.path("calibration", machine=machine(), model=m) for m in CAL["models"]]


def calibration_table_inputs():
    """Every machine's calibration file already under outdir, and this machine's (planned)."""
    found = sorted(str(p) for p in Path(L.outdir).glob("calibration/*/*.requests.parquet"))
    return list(dict.fromkeys(found + calibration_files()))


def all_targets():
    # The measured files are targets themselves: a summary re-plotted from an unfinished campaign
    # (replot=True) must not hide the runs still missing from a later measuring `snakemake all`.
    targets = [] if config["replot"] else planned_measurements()
    targets += [L.path("summary", experiment=e) for e in experiments()]
    targets += [f for name in figures() for f in L.figure_files(name)]
    if EXP["table1"]["models"]:
        targets += L.table1_files()
    if "sweep" in experiments():  # the batching advisor reads the sweep summary
        targets += L.advisor_files()
    if calibration_table_inputs():
        targets += L.calibration_table_files()
    return targets


def demo_targets():
    """make demo: the sweep, its summary and Figure 1 (a few minutes on 2 CPU cores)."""
    return [L.path("summary", experiment="sweep"), *L.figure_files("throughput_latency")]


def planned_measurements(exps=None):
    """Every measured file the targets need (runs, replication runs, capacity probes), or those of the
    experiments ``exps``."""
    files = [f for e in (experiments() if exps is None else exps) for f in experiment_runs(e)]
    files += capacity_files("whole") + (capacity_files(BUDGET) if BUDGET else [])
    files += calibration_files() if exps is None else []
    return list(dict.fromkeys(files))  # a family model may also be a sweep model


def missing_measurements(planned=None):
    """Measured files the targets need (or of ``planned``) that are not there yet."""
    return [f for f in (planned_measurements() if planned is None else planned) if not Path(f).exists()]


def check_replot():
    """replot=True draws what is there: stop if nothing of this configuration is, warn about the rest."""
    planned = planned_measurements([e for e in EXPERIMENTS if experiment_runs(e)])
    missing = missing_measurements(planned)
    if planned and len(missing) == len(planned):
        raise WorkflowError(
            f"replot: none of the {len(planned)} measured results of this configuration is under {L.outdir}/ "
            f"(e.g. {missing[0]}): nothing to plot. Set outdir (and the configfile) to where the results are, "
            "or run the measurements first."
        )
    if missing:
        logger.warning(
            f"replot: {len(missing)} of {len(planned)} measured results are not there yet (e.g. {missing[0]}); "
            "the figures and Table 1 show the rest, and their captions count and name what is missing."
        )


def gpus_visible():
    from slmserve import nvml

    return nvml.gpu_count() > 0


def jobs_run_here():
    """False when an executor plugin submits the jobs (SLURM, ...): they run on other machines, with their GPUs."""
    plugin = workflow.executor_plugin
    return plugin is None or not plugin.common_settings.non_local_exec


def check_engine_or_results():
    """Stop before any job when the paper's measurements would run on this machine without an NVIDIA GPU."""
    if config["allow_cpu"] or config["replot"] or not jobs_run_here() or gpus_visible():
        return
    missing = missing_measurements()
    if missing:
        raise WorkflowError(
            f"no NVIDIA GPU visible and {len(missing)} measured results are missing (e.g. {missing[0]}): "
            "the paper's experiments need GPUs. On this machine run `make demo` (the CPU smoke "
            "reproduction, config/smoke.yaml), or `make replot` to rebuild figures from results/."
        )
