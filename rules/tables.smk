# Table 1 from the capacity probes: largest batch per model (paper, analytic, measured).


rule table1:
    localrule: True
    input:
        whole=ancient(measured(capacity_files("whole"))),
        budget=ancient(measured(capacity_files(BUDGET) if BUDGET else [])),
    output:
        csv=report(L.path("table1", ext="csv"), caption="../report/table1.rst", category="Table 1"),
        md=L.path("table1", ext="md"),
    params:
        models=config["models"],
        planned=EXP["table1"]["models"],
        budget_gb=BUDGET,
        workload=WL,
    log:
        f"{LOGS}/figures/table1.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/table1.py"


# The batching advisor (the follow-up paper): per sweep model, the smallest one-GPU batch reaching
# experiments.advisor.fraction of the throughput plateau, its KV memory need from the formula and the
# probes, the memory it frees; a table and a figure (slmserve.advisor).


rule advisor:
    localrule: True
    input:
        summary=L.path("summary", experiment="sweep"),
        whole=ancient(measured(advisor_probes("whole"))),
        budget=ancient(measured(advisor_probes(BUDGET) if BUDGET else [])),
    output:
        csv=report(L.path("advisor", ext="csv"), caption="../report/advisor.rst", category="Advisor"),
        md=L.path("advisor", ext="md"),
        figure=report(
            multiext(L.figure_stem("advisor"), *FIGURE_EXTS), caption="../report/advisor.rst", category="Advisor"
        ),
    params:
        models=config["models"],
        planned=SWEEP["models"],
        settings=EXP["advisor"],
    log:
        f"{LOGS}/figures/advisor.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/advisor.py"


# Every machine's calibration point side by side (slmserve.calibration): how far machines differ.


rule calibration_table:
    localrule: True
    input:
        ancient(calibration_table_inputs()),
    output:
        csv=report(L.path("calibration_table", ext="csv"), caption="../report/calibration.rst", category="Machines"),
        md=L.path("calibration_table", ext="md"),
    log:
        f"{LOGS}/figures/calibration.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/calibration_table.py"
