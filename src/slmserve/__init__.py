"""slmserve: measure how small language models serve on vLLM.

One module per concept. Measuring: :mod:`runner` (sweeps, output-length points, KV probes), :mod:`replication`
and :mod:`mps` (replicas, under NVIDIA MPS), :mod:`measure` (one load on running servers, result files),
:mod:`journal` (repeats saved as they end, resumed), :mod:`server` (vLLM server lifecycle), :mod:`batchcap`
and :mod:`vllm_scheduler` (the batch capped in vLLM's scheduler), :mod:`loadgen` (the load generator),
:mod:`enginemetrics` (vLLM's /metrics), :mod:`telemetry` and :mod:`nvml` (GPU and host sampling),
:mod:`gpuslots` (GPU pinning), :mod:`jobguard` (a job's signals, parent and target lock), :mod:`dataset`
(ShareGPT prompts), :mod:`machine` (the machine's name for its calibration point), :mod:`pinning` (CPU
placement, benchmarks). Results: :mod:`analysis` (summaries), :mod:`stats` (repeats, CIs), :mod:`figures`,
:mod:`table1`, :mod:`advisor` (the batching advisor), :mod:`calibration` (machines side by side),
:mod:`capacity` (KV arithmetic), :mod:`layout` (paths and the figure registry), :mod:`provenance`, :mod:`io`,
:mod:`config`.
"""

__version__ = "0.1.0"
