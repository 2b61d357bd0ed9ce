# Figures (altair; PNG and SVG through vl-convert, self-contained HTML, a caption file each): one rule per
# figure of slmserve.layout.FIGURES, drawn from the summary it names.

for _fig in FIGURES.values():

    rule:
        name:
            f"figure_{_fig.name}"
        localrule: True
        input:
            summary=L.path("summary", experiment=_fig.source),
        output:
            report(
                multiext(L.figure_stem(_fig.name), *FIGURE_EXTS),
                caption=f"../{_fig.caption_rst}",
                category="Figures",
            ),
        log:
            f"{LOGS}/figures/{_fig.name}.log",
        conda:
            "../envs/figures.yaml"
        script:
            "../workflow/scripts/figure.py"
