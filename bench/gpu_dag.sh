#!/usr/bin/env bash
# Runs the workflow (real Snakemake, real DAG) on an offline GPU host reached through short device calls:
# the first call starts Snakemake in its own session so it outlives the call; every call then waits up to
# WAIT_S seconds and packs what is finished into $OUT/results.tgz (outdir, logs, Snakemake's log).
#
#   bench/gpu_dag.sh CONFIGFILE WAIT_S [snakemake targets or options...]
#   (GPUS=k sets --resources gpu=k; default: the GPUs nvidia-smi lists)
#
# Needs, carried in .gpu-carry/: snake/ (Snakemake and its wheels that the image lacks), extra/ (polars wheels
# and the prepared prompts parquet); the vLLM wheel set installed by ../shared/gpu/install-wheelhouse.sh in
# /tmp/vllm-site. Optional .gpu-carry/resume.tgz: results of an earlier machine, unpacked before the start so
# the DAG resumes from them. Set SLMSERVE_GIT_SHA to the commit the tree was sent from (no .git travels).
set -uo pipefail
cfg=${1:?config file}; wait_s=${2:?seconds to wait}; shift 2
repo=$PWD; wf=/tmp/wf; site=/tmp/site; carry=$repo/.gpu-carry
export PYTHONPATH=/tmp/vllm-site:$site:$wf/src VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
outdir=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['outdir'])" "$cfg")

pipt=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site")
[ -d "$site/snakemake" ] || "${pipt[@]}" "$carry"/snake/*.whl || exit 3
[ -d "$site/polars" ] || "${pipt[@]}" "$carry"/extra/*.whl || exit 3
if [ ! -f "$wf/.pid" ]; then
  rm -rf "$wf" && mkdir -p "$wf/$outdir/data"
  git ls-files -z 2>/dev/null | xargs -0 -r cp --parents -t "$wf" || cp -a "$repo"/. "$wf"/
  [ -f "$wf/Snakefile" ] || cp -a "$repo"/. "$wf"/
  cp "$carry"/extra/prompts-*.parquet "$wf/$outdir/data/"
  [ -f "$carry/resume.tgz" ] && tar xzf "$carry/resume.tgz" -C "$wf" && echo "resumed from resume.tgz"
  cd "$wf" || exit 3
  date -u +%FT%TZ >"$wf/.started"
  gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  [ "${gpus:-0}" -gt 0 ] 2>/dev/null || gpus=1
  echo "Snakemake with --resources gpu=$gpus"
  setsid nohup bash -c 'python3 -m snakemake --configfile "$0" --cores 4 --resources gpu='"$gpus"' \
      --rerun-incomplete "${@}"; echo "snakemake exit $?" >>"'"$wf"'/snakemake.log"' \
      "$cfg" "$@" >"$wf/snakemake.log" 2>&1 </dev/null &
  echo $! >"$wf/.pid"
fi
cd "$wf" || exit 3
pid=$(cat .pid); t0=$SECONDS
while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$wait_s" ]; do sleep 5; done
kill -0 "$pid" 2>/dev/null && echo "RUNNING since $(cat .started)" || echo "FINISHED (started $(cat .started), now $(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
tar czf "$OUT/results.tgz" --exclude='*.tmp' "$outdir" logs snakemake.log .started 2>/dev/null
ls -la "$OUT"
grep -E "^\[|rule |Finished job|Error|error|exit" snakemake.log | tail -n 40
