#!/usr/bin/env bash
# Runs a measuring command on an offline GPU host reached through short device calls: the first call starts
# it in its own session (it outlives the call); every call waits up to WAIT_S seconds and packs OUTDIR and the
# command's log into $OUT/bench.tgz.
#
#   bench/gpu_bench.sh WAIT_S OUTDIR COMMAND...     first call: start COMMAND (run in a copy of the tree)
#   bench/gpu_bench.sh WAIT_S OUTDIR                later calls: wait, then pack
#
# Needs the vLLM wheel set installed in /tmp/vllm-site (bench/gpu_payload.sh install) and polars' wheels in
# $GPU_CARRY/extra (default /tmp/payload/extra). Set SLMSERVE_GIT_SHA to the commit the tree was sent from.
set -uo pipefail
wait_s=${1:?seconds to wait}; outdir=${2:?output folder}; shift 2
repo=$PWD; wf=/tmp/bench-wf; site=/tmp/site; carry=${GPU_CARRY:-/tmp/payload}
export PYTHONPATH=/tmp/vllm-site:$site:$wf/src VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
[ -d "$site/polars" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target "$site" "$carry"/extra/*.whl || exit 3
if [ ! -f "$wf/.pid" ]; then
  [ $# -gt 0 ] || { echo "no command given and none running" >&2; exit 2; }
  rm -rf "$wf" && mkdir -p "$wf" && cp -a "$repo"/. "$wf"/ && cd "$wf" || exit 3
  date -u +%FT%TZ >.started
  printf '%q ' "$@" >.command
  setsid nohup bash -c "$(cat .command)" >"$wf/bench.log" 2>&1 </dev/null &
  echo $! >.pid
fi
cd "$wf" || exit 3
pid=$(cat .pid); t0=$SECONDS
while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$wait_s" ]; do sleep 5; done
kill -0 "$pid" 2>/dev/null && echo "RUNNING since $(cat .started)" || echo "FINISHED (started $(cat .started), now $(date -u +%FT%TZ))"
tar czf "$OUT/bench.tgz" --exclude='*.tmp' "$outdir" bench.log .started .command 2>/dev/null
ls -la "$OUT"; grep -E "==|Error|error|Traceback" bench.log | tail -n 20; tail -n 5 bench.log
