"""The sweep runner's handling of an engine that does not serve a model (e.g. a family missing from vLLM's
registry): one server start, every batch size written as an ``unsupported`` result, reported in the
Figure 2 (left) caption. The vLLM server is replaced by a stand-in class (named as such) that fails as vLLM
does; the real server is exercised in test_server.py and test_engine.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from slmserve import analysis, capacity, dataset, figures, io, journal, runner
from slmserve.server import InfeasibleError, UnsupportedError
from tests.conftest import ROOT


class StandInUnsupportedServer:
    """Fails like VllmServer when vLLM refuses the model's architecture; counts its starts."""

    starts = 0

    def __init__(self, spec: object) -> None:
        self.spec = spec

    def __enter__(self) -> StandInUnsupportedServer:
        type(self).starts += 1
        raise UnsupportedError("Model architectures ['MPTForCausalLM'] are not supported for now")

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("batch_control", ["restart", "scheduler", "client"])
def test_unsupported_model_is_one_start_and_a_result_per_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_control: str
) -> None:
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    StandInUnsupportedServer.starts = 0
    prompts = tmp_path / "prompts.parquet"
    rows = {"request_id": [0, 1], "source_id": ["a", "b"], "source_index": [0, 1], "original_len": [9, 9],
            "prompt_len": [4, 4], "token_ids": [[1, 2, 3, 4]] * 2, "tokenizer": ["t"] * 2}  # fmt: skip
    io.write_parquet(pl.DataFrame(rows, schema=dataset.SCHEMA), prompts, {})
    sizes = [1, 2, 4]
    outputs = {b: (tmp_path / f"bs{b}.requests.parquet", tmp_path / f"bs{b}.telemetry.parquet") for b in sizes}
    job = runner.SweepJob(
        model="mpt7b", model_path="config/models/mpt-7b", load_format="dummy", tensor_parallel=1,
        batch_sizes=sizes, prompts_path=prompts, outputs=outputs, log_dir=tmp_path, input_len=4,
        output_len=4, num_requests=2, batch_control=batch_control, telemetry_enabled=False,
        engine_args=["--attention-backend", "TRITON_ATTN"],
    )  # fmt: skip
    kept = journal.partial_paths(outputs[1], 0)  # a repeat left by an earlier, stopped job
    kept[0].parent.mkdir()
    kept[0].write_bytes(b"")
    runner.run_sweep(job)
    assert StandInUnsupportedServer.starts == 1
    assert not kept[0].parent.exists()  # the point has its result: nothing is left to resume
    summary = analysis.summarize_runs([str(outputs[b][0]) for b in sizes], {"mpt7b": {"family": "MPT"}})
    assert summary["status"].to_list() == ["unsupported"] * 3
    assert summary["engine_args"].to_list() == ["--attention-backend TRITON_ATTN"] * 3  # recorded with each run
    assert summary["batch_size"].to_list() == sizes
    _, caption = figures.families(summary)
    assert "MPT-7B: not served: Model architectures ['MPTForCausalLM'] are not supported for now" in caption
    assert "3 not run: the engine does not serve the model" in caption


def _probe_job(tmp_path: Path, model: str, folder: str) -> runner.SweepJob:
    """A KV-cache probe's job of ``model`` (its config in config/models/``folder``), the paper's workload."""
    return runner.SweepJob(
        model=model, model_path=f"config/models/{folder}", load_format="dummy", tensor_parallel=1,
        batch_sizes=[512], prompts_path=Path("-"), outputs={}, log_dir=tmp_path, input_len=512, output_len=256,
        num_requests=1,
    )  # fmt: skip


def test_a_kv_probe_of_an_unsupported_model_is_a_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    StandInUnsupportedServer.starts = 0
    job = _probe_job(tmp_path, "mpt7b", "mpt-7b")
    out = tmp_path / "mpt7b-whole.json"
    result = runner.probe_capacity(job, None, out)
    assert StandInUnsupportedServer.starts == 1
    on_disk = capacity.read_probe(out)
    assert on_disk["status"] == result["status"] == "unsupported"
    assert on_disk["reason"] == "Model architectures ['MPTForCausalLM'] are not supported for now"
    assert on_disk["kv_cache_tokens"] is None and on_disk["max_batch_admission"] is None  # not a capacity of 0
    assert on_disk["provenance"]["config_hash"]
    with pytest.raises(UnsupportedError, match=r"mpt7b-whole.json: the engine does not serve mpt7b \(Model arch"):
        runner.max_batch_from_probe(on_disk, "admission")
    here = {"engine": "vllm", "engine_version": "0.26.0"}
    monkeypatch.setattr(runner.provenance, "engine_info", lambda: here)
    same = {**on_disk, "provenance": {**on_disk["provenance"], **here}}
    with pytest.raises(UnsupportedError):
        runner.max_batch_from_probe(same, "admission")
    other = {**on_disk, "provenance": {**on_disk["provenance"], "engine": "vllm", "engine_version": "0.1.7"}}
    with pytest.raises(capacity.ProbeMismatch, match=r"mpt7b-whole.json: measured on another kind.*'0.1.7' there"):
        runner.max_batch_from_probe(other, "admission")  # another engine's "unsupported" is not this one's


def test_a_kv_probe_whose_budget_exceeds_the_gpu_is_recorded_infeasible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Table 1's 36 GB probe on a 24 GB GPU: the memory settings refuse it before any start; that is a result
    (as a sweep records it), not a failed job."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    refused = "memory budget 36.0 GB exceeds the GPU's 24.0 GB"

    def too_small(job: runner.SweepJob, alloc: object) -> dict[str, object]:
        raise InfeasibleError(refused)

    monkeypatch.setattr(runner, "memory_settings", too_small)
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    StandInUnsupportedServer.starts = 0
    job = _probe_job(tmp_path, "opt13b", "opt-13b")
    out = tmp_path / "opt13b-36gb.json"
    runner.probe_capacity(job, 36.0, out)
    on_disk = capacity.read_probe(out)
    assert on_disk["status"] == "infeasible" and on_disk["reason"] == refused and StandInUnsupportedServer.starts == 0
    assert on_disk["kv_cache_tokens"] == 0 and on_disk["gpu_memory_utilization"] is None
    assert on_disk["provenance"]["config_hash"]


def test_an_unsupported_probe_of_another_gpu_model_is_not_this_hosts_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same engine, but measured on an H100 while this host's GPUs are H200s: a mismatch, found before the job
    holds a GPU (the pool's one model); the same probe from an H200, or a host of mixed or no GPUs, is the
    engine's verdict."""
    here = {"engine": "vllm", "engine_version": "0.26.0"}
    monkeypatch.setattr(runner.provenance, "engine_info", lambda: dict(here))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "0,1")
    monkeypatch.setattr(runner.gpuslots, "nvml_indices", lambda ids: tuple(int(i) for i in ids))
    pool = {0: "NVIDIA H200", 1: "NVIDIA H200"}
    monkeypatch.setattr(runner.provenance, "gpu_info", lambda ids: {"gpu_models": [pool[i] for i in ids]})
    probe = {"model": "mpt7b", "status": "unsupported", "reason": "no", "source": "mpt7b-whole.json",
             "provenance": {**here, "gpu_models": ["NVIDIA H100 80GB HBM3"]}}  # fmt: skip
    with pytest.raises(capacity.ProbeMismatch, match=r"mpt7b-whole.json: .*'NVIDIA H100 80GB HBM3'\] there"):
        runner.max_batch_from_probe(probe, "admission")
    h200 = {**probe, "provenance": {**here, "gpu_models": ["NVIDIA H200"]}}
    with pytest.raises(UnsupportedError, match="the engine does not serve mpt7b"):
        runner.max_batch_from_probe(h200, "admission")
    pool[1] = "NVIDIA H100 80GB HBM3"  # a mixed pool names no one GPU model: the engine's verdict stands
    with pytest.raises(UnsupportedError):
        runner.max_batch_from_probe(probe, "admission")
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    with pytest.raises(UnsupportedError):
        runner.max_batch_from_probe(probe, "admission")


def test_prompt_ids_are_folded_into_a_smaller_vocabulary(tmp_path: Path) -> None:
    prompts = pl.DataFrame({"token_ids": [[5, 31_999, 32_000, 50_256], [1, 2]]})
    folded, n = runner.fit_vocabulary(prompts, 32_000)
    assert n == 2
    assert folded["token_ids"].to_list() == [[5, 31_999, 0, 18_256], [1, 2]]
    same, n = runner.fit_vocabulary(prompts, 50_272)  # OPT's vocabulary holds every GPT-2 id
    assert n == 0 and same["token_ids"].to_list() == prompts["token_ids"].to_list()
    assert runner.fit_vocabulary(prompts, None)[1] == 0


def test_llama_jobs_record_the_folding_and_captions_state_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.parquet"
    rows = {"request_id": [0], "source_id": ["a"], "source_index": [0], "original_len": [9], "prompt_len": [3],
            "token_ids": [[40_000, 7, 50_000]], "tokenizer": ["t"]}  # fmt: skip
    io.write_parquet(pl.DataFrame(rows, schema=dataset.SCHEMA), prompts, {})
    job = runner.SweepJob(
        model="llama7b", model_path=str(ROOT / "config/models/llama-7b"), load_format="dummy", tensor_parallel=1,
        batch_sizes=[1], prompts_path=prompts, outputs={}, log_dir=tmp_path, input_len=3, output_len=4,
        num_requests=1,
    )  # fmt: skip
    got = runner.load_prompts(job)
    assert got["token_ids"].to_list() == [[8_000, 7, 18_000]]
    assert job.describe()["extra"] == {"prompt_ids_folded_into_vocab": 32_000}
    summary = pl.DataFrame({"model": ["llama7b"], "status": ["ok"], "prompt_ids_folded_into_vocab": [32_000]})
    text = figures.caption(summary, "x")
    assert "LLaMA-7B: prompt token ids (GPT-2 BPE) folded into its 32,000-token vocabulary" in text


def test_a_models_engine_args_reach_the_server_the_record_and_the_caption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    args = ["--attention-backend", "TRITON_ATTN"]
    job = runner.SweepJob(
        model="mpt7b", model_path="config/models/mpt-7b", load_format="dummy", tensor_parallel=1,
        batch_sizes=[1], prompts_path=Path("-"), outputs={}, log_dir=tmp_path, input_len=4, output_len=4,
        num_requests=1, engine_args=args,
    )  # fmt: skip
    with runner.GpuSlots(1, label="test") as alloc:
        argv = runner.server_spec(job, alloc, 8, "t").argv(8000)
    assert argv[-2:] == args and argv.count("--attention-backend") == 1
    assert job.describe()["engine_args"] == args
    plain = runner.SweepJob(**{**vars(job), "engine_args": []})
    assert "engine_args" not in plain.describe()  # the description of runs from before the setting
    summary = pl.DataFrame({"model": ["mpt7b", "opt6.7b"], "family": ["MPT", "OPT"], "params": ["7B", "6.7B"],
                            "status": ["ok", "ok"], "engine_args": [" ".join(args), None]})  # fmt: skip
    text = figures.caption(summary, "x")
    assert "MPT-7B: vLLM started with the extra arguments `--attention-backend TRITON_ATTN`" in text
    assert "OPT-6.7B: vLLM started with" not in text


@pytest.mark.parametrize("engine", ["vllm-cpu", "vllm"])
def test_tensor_parallel_without_gpus_binds_the_cpu_engines_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """No GPU visible: the CPU engine gets a core list per rank (recorded with the run, passed to the
    server); a GPU engine is refused with the reason."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.delenv(runner.CPU_BIND_ENV, raising=False)
    monkeypatch.setattr(runner.provenance, "engine_info", lambda: {"engine": engine, "engine_version": "0"})
    monkeypatch.setattr(runner.pinning, "cpu_engine_ranks", lambda tp: "|".join(map(str, range(tp))))
    job = runner.SweepJob(
        model="opt125m", model_path="config/models/opt-125m", load_format="dummy", tensor_parallel=2,
        batch_sizes=[1], prompts_path=Path("-"), outputs={}, log_dir=tmp_path, input_len=4, output_len=4,
        num_requests=1,
    )  # fmt: skip
    with runner.GpuSlots(2, label="test") as alloc:
        if engine == "vllm":
            with pytest.raises(runner.ServerError, match="tensor_parallel 2 needs GPUs; none are visible"):
                runner._check_gpus(job, alloc)
            return
        runner._check_gpus(job, alloc)
        spec = runner.server_spec(job, alloc, 8, "t")
    assert job.extra["cpu_threads_bind"] == "0|1" and spec.env[runner.CPU_BIND_ENV] == "0|1"
    assert spec.argv(8000)[spec.argv(8000).index("--tensor-parallel-size") + 1] == "2"
    monkeypatch.setenv(runner.CPU_BIND_ENV, "0-3|4-7")  # the user's own binding wins and is recorded
    runner._check_gpus(job, alloc)
    assert job.extra["cpu_threads_bind"] == "0-3|4-7"


def test_a_job_logs_its_host_cpu_and_python_speed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner.provenance, "cpu_id", lambda: "GenuineIntel 6/207/2")
    monkeypatch.setattr(runner.provenance, "host_speed_ms", lambda: 0.5036)
    job = runner.SweepJob(
        model="opt125m", model_path="config/models/opt-125m", load_format="dummy", tensor_parallel=1,
        batch_sizes=[1], prompts_path=Path("-"), outputs={}, log_dir=tmp_path, input_len=4, output_len=4,
        num_requests=1,
    )  # fmt: skip
    with caplog.at_level("INFO", logger=runner.log.name), runner.GpuSlots(1, label="test") as alloc:
        runner._check_gpus(job, alloc)
    want = f"host: {runner.provenance.cpu_model()} (GenuineIntel 6/207/2), {os.cpu_count()} cores, Python 0.504 ms"
    assert want in caplog.text


class StandInSmallServer:
    """Starts like VllmServer with a KV cache of 16 tokens (block size 16): no batch of the test fits it."""

    kv_cache_tokens, block_size, startup_s = 16, 16, 0.0

    def __init__(self, spec: object) -> None:
        self.spec = spec

    def __enter__(self) -> StandInSmallServer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def info(self) -> dict:
        return {"kv_cache_tokens": self.kv_cache_tokens}


class StandInRefusingServer(StandInSmallServer):
    """Fails like VllmServer when vLLM refuses the memory share (e.g. another process holds the GPU's memory)."""

    def __enter__(self) -> StandInRefusingServer:
        raise InfeasibleError("Free memory on device (20.1/79.2 GiB) on startup is less than desired GPU memory")


def _small_job(tmp_path: Path, sizes: list[int], batch_control: str = "scheduler") -> runner.SweepJob:
    outputs = {b: (tmp_path / f"bs{b}.requests.parquet", tmp_path / f"bs{b}.telemetry.parquet") for b in sizes}
    job = runner.SweepJob(
        model="opt125m", model_path="config/models/opt-125m", load_format="dummy", tensor_parallel=1,
        batch_sizes=sizes, prompts_path=tmp_path / "p.parquet", outputs=outputs, log_dir=tmp_path, input_len=4,
        output_len=4, num_requests=2, batch_control=batch_control, telemetry_enabled=False,
    )  # fmt: skip
    rows = {"request_id": [0, 1], "source_id": ["a", "b"], "source_index": [0, 1], "original_len": [9, 9],
            "prompt_len": [4, 4], "token_ids": [[1, 2, 3, 4]] * 2, "tokenizer": ["t"] * 2}  # fmt: skip
    io.write_parquet(pl.DataFrame(rows, schema=dataset.SCHEMA), job.prompts_path, {})
    return job


def _stand_in_repeat(k: int = 0) -> runner.Measurement:
    """One repeat's result, made up (named as such): what a stand-in measuring function returns."""
    load = {"n_ok": 1, "duration_s": 1.0, "peak_inflight": 1, "lag_p99_s": 0.0}
    return runner.Measurement(requests=pl.DataFrame({"request_id": [k]}), telemetry=pl.DataFrame({"t_mono": [0.0]}),
                              meta={"t0_mono": 0.0, "loads": [load]}, wall_s=1.0)  # fmt: skip


@pytest.mark.parametrize("server", [StandInRefusingServer, StandInSmallServer])
@pytest.mark.parametrize("same_settings", [True, False])
def test_a_point_with_saved_repeats_is_never_recorded_as_unmeasurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: type, same_settings: bool
) -> None:
    """Repeats saved by a stopped job, then a refusal or a smaller KV cache on the next machine: the job fails
    with the reason and the repeats stay for a rerun (no 'infeasible' result that would end the point).
    Saved repeats of other settings, which a rerun would not resume, do not stop the record."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", server)
    job = _small_job(tmp_path, [4])
    run = runner.Point(4, job, job.outputs[4]).meta_run()
    journal.Journal("elsewhere").save(job.outputs[4], run if same_settings else {**run, "num_requests": 9}, 0,
                                      _stand_in_repeat())  # fmt: skip
    if not same_settings:
        runner.run_sweep(job)
        assert io.read_meta(job.outputs[4][0])["status"] == "infeasible"
        return
    with pytest.raises(runner.ServerError, match=r"bs4.requests.parquet: repeats are saved from an earlier run .*"
                                                 r"Not recorded as unmeasurable"):  # fmt: skip
        runner.run_sweep(job)
    assert not job.outputs[4][0].exists() and journal.has_saved(job.outputs[4], run)


class StandInFourBlockServer(StandInSmallServer):
    """Starts like VllmServer with a KV cache of 64 tokens (4 blocks of 16): batch 4 of the test fits, 8 does not."""

    kv_cache_tokens = 64


@pytest.mark.parametrize("measured", [True, False])
def test_a_batch_that_does_not_fit_is_written_only_with_the_measured_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measured: bool
) -> None:
    """A sweep cut off part-way (here its measurement fails) leaves no result file of the sweep, not even the
    infeasible point's, which is known at the server's start: a file of it would look like a finished sweep."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInFourBlockServer)

    def measure(p: runner.Point, *args: object, **kwargs: object) -> runner.Measurement:
        if not measured:
            raise runner.ServerError("the vLLM server died during the measured run")
        return _stand_in_repeat()

    monkeypatch.setattr(runner, "measure_point", measure)
    job = _small_job(tmp_path, [4, 8])
    if measured:
        runner.run_sweep(job)
        assert io.read_meta(job.outputs[8][0])["status"] == "infeasible" and job.outputs[4][0].exists()
        return
    with pytest.raises(runner.ServerError, match="died"):
        runner.run_sweep(job)
    assert not job.outputs[8][0].exists() and not job.outputs[4][0].exists()


class StandInOneStartServer(StandInSmallServer):
    """Starts once like VllmServer (any batch fits); the second start fails as a server that dies does."""

    kv_cache_tokens, starts = None, 0

    def __enter__(self) -> StandInOneStartServer:
        type(self).starts += 1
        if type(self).starts > 1:
            raise runner.ServerError("the vLLM server died during start-up")
        return self


def test_restart_mode_keeps_each_points_repeats_until_the_job_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server per batch: the second one fails, Snakemake then deletes the first point's written result, so
    its saved repeats must still be there for the rerun."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInOneStartServer)
    monkeypatch.setattr(runner, "measure_point", lambda p, *a, **k: _stand_in_repeat())
    StandInOneStartServer.starts = 0
    job = _small_job(tmp_path, [1, 2], batch_control="restart")
    with pytest.raises(runner.ServerError, match="died"):
        runner.run_sweep(job)
    first = runner.Point(1, job, job.outputs[1])
    assert job.outputs[1][0].exists() and journal.has_saved(job.outputs[1], first.meta_run())


def test_restart_mode_does_not_record_a_later_point_with_saved_repeats_as_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    job = _small_job(tmp_path, [1, 8], batch_control="restart")
    later = runner.Point(8, job, job.outputs[8])
    journal.Journal("elsewhere").save(job.outputs[8], later.meta_run(), 0, _stand_in_repeat())
    with pytest.raises(runner.ServerError, match=r"bs8.requests.parquet: repeats are saved"):
        runner.run_sweep(job)
    assert not job.outputs[8][0].exists() and journal.has_saved(job.outputs[8], later.meta_run())


H100 = {"gpu_models": ["NVIDIA H100 80GB HBM3"], "engine": "vllm", "engine_version": "0.26.0"}
H200 = {**H100, "gpu_models": ["NVIDIA H200"]}


def _probe_of(tmp_path: Path, prov: dict) -> dict:
    """A whole-GPU probe file of OPT-6.7B measured on ``prov``'s machine, as the jobs read it."""
    path = tmp_path / "opt6.7b-whole.json"
    body = {"model": "opt6.7b", "status": "ok", "kv_cache_tokens": 118_976, "max_batch_admission": 128,
            "max_batch_no_preemption": 128, "gpu_memory_utilization": 0.9, "provenance": prov}  # fmt: skip
    path.write_text(json.dumps(body))
    return capacity.read_probe(path)


def test_a_probe_of_another_kind_of_machine_is_refused(tmp_path: Path) -> None:
    probe = _probe_of(tmp_path, H100)
    assert probe["source"] == str(tmp_path / "opt6.7b-whole.json")
    capacity.check_probe(probe, H100)  # the same kind: nothing to say
    capacity.check_probe(probe, {**H200, "gpu_models": []})  # NVML named no GPU here: not another kind
    with pytest.raises(capacity.ProbeMismatch) as err:
        capacity.check_probe(probe, H200)
    said = str(err.value)
    assert said.startswith(f"{tmp_path}/opt6.7b-whole.json: measured on another kind of machine")
    assert "gpu_models ['NVIDIA H100 80GB HBM3'] there, ['NVIDIA H200'] here" in said
    assert f"`snakemake {tmp_path}/opt6.7b-whole.json --force --configfile" in said and "outdir of its own" in said
    with pytest.raises(capacity.ProbeMismatch, match="engine 'vllm' there, 'vllm-cpu' here"):
        capacity.check_probe(probe, {**H100, "engine": "vllm-cpu"})


def test_jobs_sized_by_a_probe_refuse_one_of_another_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replication and output-length points take their batch (and replicas their memory) from the whole-GPU
    probe: on an H200 an H100's probe would give the H100's batch, so the job stops before any server starts
    and writes nothing."""
    from slmserve import provenance, replication
    from tests.test_replicas import _cpu_job

    job = _cpu_job(tmp_path, monkeypatch)
    monkeypatch.setattr(provenance, "gpu_info", lambda ids: {"gpu_models": ["NVIDIA H200"], "driver": "580"})
    monkeypatch.setattr(provenance, "engine_info", lambda: {"engine": "vllm", "engine_version": "0.26.0"})
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    StandInUnsupportedServer.starts = 0
    probe = _probe_of(tmp_path, H100)
    out = tmp_path / "opt6.7b_r2.parquet"
    with pytest.raises(capacity.ProbeMismatch, match="H100 80GB HBM3'] there, \\['NVIDIA H200'\\] here"):
        replication.run_replication(job, 2, 128, out, probe=probe, use_mps=True)  # MPS: no server either way
    assert not out.exists()
    points = {(32, float("inf")): (tmp_path / "out32.requests.parquet", tmp_path / "out32.telemetry.parquet")}
    with pytest.raises(capacity.ProbeMismatch, match=r"opt6\.7b-whole\.json: measured on another kind"):
        runner.run_points(job, 128, points, probe)
    assert StandInUnsupportedServer.starts == 0 and not points[32, float("inf")][0].exists()
    replication.run_replication(job, 2, 128, out, probe=_probe_of(tmp_path, H200), use_mps=True)  # its own GPU's
    assert io.read_meta(out)["status"] == "unsupported"  # MPS needs a GPU: this CPU job has none


def test_a_gpu_profiles_job_on_a_node_without_gpus_fails_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """allow_cpu false (the paper's profiles), no GPU in the pool (a SLURM node without one): the sweep, the
    probe and a replication fail before any server starts, naming the setting, instead of measuring the CPU."""
    from slmserve import replication
    from slmserve.gpuslots import NoGpuError

    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    monkeypatch.setattr(runner, "VllmServer", StandInUnsupportedServer)
    monkeypatch.setattr(replication, "VllmServer", StandInUnsupportedServer)
    StandInUnsupportedServer.starts = 0
    prompts = tmp_path / "prompts.parquet"
    rows = {"request_id": [0], "source_id": ["a"], "source_index": [0], "original_len": [9], "prompt_len": [4],
            "token_ids": [[1, 2, 3, 4]], "tokenizer": ["t"]}  # fmt: skip
    io.write_parquet(pl.DataFrame(rows, schema=dataset.SCHEMA), prompts, {})
    outputs = {1: (tmp_path / "bs1.requests.parquet", tmp_path / "bs1.telemetry.parquet")}
    job = runner.SweepJob(
        model="opt125m", model_path="config/models/opt-125m", load_format="dummy", tensor_parallel=1,
        batch_sizes=[1], prompts_path=prompts, outputs=outputs, log_dir=tmp_path, input_len=4, output_len=4,
        num_requests=1, telemetry_enabled=False, allow_cpu=False,
    )  # fmt: skip
    refused = r"opt125m .*GPU pool is empty.*allow_cpu: false\. Run the job on a node with an NVIDIA GPU"
    with pytest.raises(NoGpuError, match=refused):
        runner.run_sweep(job)
    with pytest.raises(NoGpuError, match="allow_cpu: false"):
        runner.probe_capacity(job, None, tmp_path / "whole.json")
    with pytest.raises(NoGpuError, match="allow_cpu: false"):
        replication.run_replication(job, 2, 8, tmp_path / "r2.parquet")
    assert StandInUnsupportedServer.starts == 0
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.parquet"]  # no result, no partial file
