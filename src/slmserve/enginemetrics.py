"""vLLM's own Prometheus metrics (``GET /metrics``): counters around a run, and the running-request gauge
polled during it.

A run records, per server:

* ``server_counters``: each ``vllm:*_total`` counter after the measured requests minus after the warm-up
  (summed over label sets), e.g. ``vllm:num_preemptions_total`` (requests preempted for lack of KV cache).
  A run marks this with ``counters_after_warmup``; results without it (written before 2026-11-29) read the
  counters before the warm-up, so their counts include the warm-up's requests;
* ``running``: :class:`GaugePoller` samples of ``vllm:num_requests_running`` (requests in the running
  batch) and ``vllm:num_requests_waiting``, at most once per second: faster polling slows a host-bound
  model's API server. Effective batch = the time average of the running gauge over the run's window
  (:func:`effective_batch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
POLL_S = 1.0


# the servers listen on 127.0.0.1: a host's http_proxy must not carry these reads (the load generator's
# aiohttp session ignores it too)
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(base_url: str, timeout: float = 5.0) -> str:
    """The text of ``{base_url}/metrics``; empty if it cannot be read."""
    with contextlib.suppress(OSError, ValueError), LOOPBACK.open(f"{base_url}/metrics", timeout=timeout) as r:
        return r.read().decode()
    return ""


def parse(text: str) -> dict[str, float]:
    """Every vLLM sample of a metrics text, summed over label sets: counters under their ``..._total``
    name, gauges under their own name. Unparsable text gives what was read before it."""
    values: dict[str, float] = {}
    with contextlib.suppress(ValueError):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("vllm:") and not sample.name.endswith(("_bucket", "_created")):
                    values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def counters(text: str) -> dict[str, float]:
    """The ``vllm:*_total`` counters of a metrics text."""
    return {k: v for k, v in parse(text).items() if k.endswith("_total")}


def labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample named ``name`` (e.g. ``vllm:cache_config_info``); empty if none."""
    with contextlib.suppress(ValueError):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return dict(sample.labels)
    return {}


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """``after - before`` per counter (a counter absent before counts from 0); None if either read failed
    (empty), rather than counting a long-running server's totals as this run's."""
    if not before or not after:
        return None
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


class GaugePoller:
    """Poll the running and waiting gauges of one server every ``interval_s`` (>= 1 s) in a thread; with
    ``keep``, also those samples of every read (:attr:`kept`, ``(t_mono, {name: value})``, a failed read's
    empty), and with ``extra`` what it returns at that moment, merged into the read's values.
    :meth:`read_now` takes one read out of turn (at a run's warm-up end: a moment the 1 s polls may miss)."""

    def __init__(
        self,
        base_url: str,
        interval_s: float = POLL_S,
        keep: tuple[str, ...] = (),
        extra: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.base_url = base_url
        self.interval_s = max(POLL_S, interval_s)
        self.samples: list[tuple[float, float | None, float | None]] = []  # (t_mono, running, waiting)
        self.keep = keep
        self.extra = extra
        self.kept: list[tuple[float, dict[str, float]]] = []
        self._stopping = False
        self._wake = threading.Event()  # set by read_now and by the exit
        self._reads = threading.Condition()
        self._started = self._finished = 0  # reads begun and ended, for read_now
        self._thread = threading.Thread(target=self._run, name="slmserve-gauges", daemon=True)

    def _run(self) -> None:
        while True:
            with self._reads:
                self._started += 1
                number = self._started
            values = parse(fetch(self.base_url, timeout=5.0))  # a busy API server may answer late
            now = time.monotonic()
            self.samples.append((now, values.get(RUNNING), values.get(WAITING)))
            if self.keep or self.extra:
                kept = {k: values[k] for k in self.keep if k in values}
                self.kept.append((now, {**kept, **(self.extra() if self.extra else {})}))
            with self._reads:
                self._finished = number
                self._reads.notify_all()
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopping:
                return

    def read_now(self, timeout_s: float = 15.0) -> bool:
        """Have the polling thread take a read that begins after this call, and wait until it is kept (at most
        ``timeout_s``: a read under way, then this one, each with a 5 s timeout per socket operation); True if
        it was. The next poll comes ``interval_s`` later."""
        with self._reads:
            wanted = self._started + 1  # a read under way may have begun before the moment asked for
            self._wake.set()
            return self._reads.wait_for(lambda: self._finished >= wanted, timeout_s)

    def __enter__(self) -> GaugePoller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()


Sample = tuple[float, float | None, float | None]  # (t_mono, running, waiting)


def effective_batch(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    """Running-request statistics of the samples taken in ``[start, end]`` (monotonic seconds):
    ``effective_batch`` = mean of the running gauge's samples (a time average as far as the polls are evenly
    spaced: one per second plus the time a /metrics read takes, up to 5 s from a busy API server),
    ``running_max`` = its largest sample, ``gauge_samples`` = how many samples (a short run has few: summaries
    and captions carry the count); None without samples."""
    running = [r for t, r, _ in samples if start <= t <= end and r is not None]
    if not running:
        return {"effective_batch": None, "running_max": None, "gauge_samples": 0}
    return {"effective_batch": sum(running) / len(running), "running_max": max(running), "gauge_samples": len(running)}
