"""slmserve: measure how small language models serve on vLLM.

One module per concept: :mod:`dataset` (ShareGPT prompts), :mod:`server` (vLLM server lifecycle),
:mod:`loadgen` (the load generator), :mod:`telemetry` (GPU and host sampling), :mod:`gpuslots`
(GPU pinning), :mod:`runner` (one measured configuration), :mod:`analysis` (merge and summaries),
:mod:`figures` (altair charts), :mod:`provenance` and :mod:`io` (what every result file carries).
"""

__version__ = "0.1.0"
