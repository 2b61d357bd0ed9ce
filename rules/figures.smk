# Figures (altair; PNG and SVG through vl-convert, self-contained HTML, a caption file each), one rule
# per figure of slmserve.figures.FIGURES, drawn from the summary named in FIGURE_SOURCES.

for _name, _source in FIGURE_SOURCES.items():

    rule:
        name:
            f"figure_{_name}"
        localrule: True
        input:
            summary=f"{OUT}/summary/{_source}.parquet",
        output:
            report(
                multiext(f"{FIG}/{_name}", ".png", ".svg", ".html", ".caption.md"),
                caption=f"../report/{_name}.rst",
                category="Figures",
            ),
        log:
            f"{LOGS}/figures/{_name}.log",
        conda:
            "../envs/figures.yaml"
        script:
            "../workflow/scripts/figure.py"
