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
