"""What the measuring scripts share: logging to the rule's log file, and the rule's ``SweepJob``.

Snakemake puts the folder of a local ``script:`` on ``sys.path``, so the scripts import this module as
``common``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slmserve.runner import SweepJob


def log_to_file(snakemake: Any) -> None:
    """Log at INFO to the rule's first log file (its job's folder of server logs is beside it)."""
    logging.basicConfig(
        filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def sweep_job(snakemake: Any, outputs: Mapping | None = None, prompts: str | None = None, **job: Any) -> SweepJob:
    """The rule's ``params.job`` (overridden by ``job``) with its prompts (``params.prompts`` unless
    given), ``outputs`` and a log folder named after the log file."""
    return SweepJob(
        # not a param: the setting decides only whether a GPU-less node may run the job, not what it measures
        **{"allow_cpu": snakemake.config["allow_cpu"], **snakemake.params.job, **job},
        prompts_path=Path(snakemake.params.prompts if prompts is None else prompts),
        outputs=dict(outputs or {}),
        log_dir=Path(snakemake.log[0]).with_suffix(""),
    )
