# Stage 4: figures (altair; PNG and SVG through vl-convert, self-contained HTML, a caption file each).


rule figure_throughput_latency:
    input:
        summary=f"{OUT}/summary/sweep.parquet",
    output:
        report(
            multiext(f"{FIG}/throughput_latency", ".png", ".svg", ".html", ".caption.md"),
            caption="../report/throughput_latency.rst",
            category="Figures",
        ),
    log:
        f"{LOGS}/figures/throughput_latency.log",
    conda:
        "../envs/figures.yaml"
    script:
        "../workflow/scripts/figure.py"
