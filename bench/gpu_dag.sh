#!/usr/bin/env bash
# Runs the workflow (real Snakemake, real DAG) on an offline GPU host reached through short device calls:
# the first call starts Snakemake in its own session so it outlives the call; every call then waits up to
# WAIT_S seconds and packs what this machine finished into $OUT/results.tgz (outdir, logs, Snakemake's log).
#
#   bench/gpu_dag.sh CONFIGFILE WAIT_S [snakemake targets or options...] [+ CONFIGFILE [targets...]]...
#   (GPUS=k sets --resources gpu=k; default: the GPUs nvidia-smi lists. Stages separated by "+" run one
#   after another, each its own Snakemake run over its own config, e.g. probes of the paper config, then
#   the rest of the quick profile. Later calls, while Snakemake runs: CONFIGFILE WAIT_S, the rest ignored.
#   FRESH="path ..." removes those paths of the copied tree first: the committed results of a profile being
#   measured again, which Snakemake would otherwise take as done, having no metadata of their params;
#   NO_START_AFTER=epoch-seconds starts no stage after then: a machine lent for 30 minutes loses a job it
#   cannot finish, so give each long job its own stage; GPU_WF, GPU_SITE: the run's tree and Snakemake's
#   install, /tmp/wf and /tmp/site unless set, as tests/test_gpu_dag.py sets them)
#
# Needs, carried in .gpu-carry/: snake/ (Snakemake and its wheels that the image lacks), extra/ (polars wheels
# and the prepared prompts parquet); the vLLM wheel set installed by ../shared/gpu/install-wheelhouse.sh in
# /tmp/vllm-site. The DAG resumes from the tree's committed results; optional .gpu-carry/resume.tgz: results
# not committed yet, unpacked over them. Set SLMSERVE_GIT_SHA to the commit the tree was sent from (the .git
# there, if any, need not be current).
set -uo pipefail
cfg=${1:?config file}; wait_s=${2:?seconds to wait}; shift 2
repo=$PWD; wf=${GPU_WF:-/tmp/wf}; site=${GPU_SITE:-/tmp/site}; carry=${GPU_CARRY:-$repo/.gpu-carry}
export PYTHONPATH=/tmp/vllm-site:$site:$wf/src VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
outdir_of() { python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['outdir'])" "$1"; }
# The stages: "CONFIG targets..." separated by "+"; their configs name the outdirs packed on every call.
stages=() stage="$cfg"
for a in "$@"; do
  if [ "$a" = "+" ]; then [ -n "$stage" ] && stages+=("$stage"); stage=""; else stage+="${stage:+ }$a"; fi
done
[ -n "$stage" ] && stages+=("$stage")

pipt=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site")
[ -d "$site/snakemake" ] || "${pipt[@]}" "$carry"/snake/*.whl || exit 3
[ -d "$site/polars" ] || "${pipt[@]}" "$carry"/extra/*.whl || exit 3
if [ ! -f "$wf/.pid" ]; then
  rm -rf "$wf" && mkdir -p "$wf"
  # The device's git index can predate the tree it was sent (2026-11-25: files removed since): copy what
  # exists of the index, plus new files it does not know yet (--others), never the ignored ones.
  git ls-files -z --cached --others --exclude-standard 2>/dev/null \
    | while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done \
    | xargs -0 -r cp --parents -t "$wf" || cp -a "$repo"/. "$wf"/
  [ -f "$wf/Snakefile" ] || cp -a "$repo"/. "$wf"/
  for p in ${FRESH:-}; do rm -rf "${wf:?}/$p" && echo "removed $p (FRESH)"; done
  : >"$wf/.outdirs"
  for st in "${stages[@]}"; do
    od=$(outdir_of "${st%% *}") && [ -n "$od" ] || { echo "no outdir in ${st%% *}" >&2; exit 3; }
    grep -qxF "$od" "$wf/.outdirs" && continue  # stages of one config share its outdir
    mkdir -p "$wf/$od/data" && cp "$carry"/extra/prompts-*.parquet "$wf/$od/data/"
    echo "$od" >>"$wf/.outdirs"
  done
  [ -f "$repo/.gpu-carry/resume.tgz" ] && tar xzf "$repo/.gpu-carry/resume.tgz" -C "$wf" && echo "resumed from resume.tgz"
  cd "$wf" || exit 3
  date -u +%FT%TZ >"$wf/.started"
  gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  [ "${gpus:-0}" -gt 0 ] 2>/dev/null || gpus=1
  echo "Snakemake with --resources gpu=$gpus; stages:"; printf '  %s\n' "${stages[@]}"
  script=""
  for st in "${stages[@]}"; do
    # a stage is "CONFIG target..." (no spaces inside paths); the targets go last: --configfile and
    # --resources take several values and would swallow them
    cmd="python3 -m snakemake --configfile ${st%% *} --cores 4 --resources gpu=$gpus --rerun-incomplete --keep-going"
    [ "$st" = "${st%% *}" ] || cmd+=" ${st#* }"
    cmd+="; echo \"snakemake exit \$? ($st)\"; "
    [ -z "${NO_START_AFTER:-}" ] ||
      cmd="if [ \$(date +%s) -ge $NO_START_AFTER ]; then echo \"stage not started: past NO_START_AFTER ($st)\"; else ${cmd}fi; "
    script+=$cmd
  done
  setsid nohup bash -c "$script" >"$wf/snakemake.log" 2>&1 </dev/null &
  echo $! >"$wf/.pid"
fi
cd "$wf" || exit 3
pid=$(cat .pid); t0=$SECONDS
while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$wait_s" ]; do sleep 5; done
kill -0 "$pid" 2>/dev/null && echo "RUNNING since $(cat .started)" || echo "FINISHED (started $(cat .started), now $(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
mapfile -t outdirs <.outdirs
# Only what this machine wrote (resumed files keep their archive times): a small reply shortens the idle gap.
mapfile -t made < <(find "${outdirs[@]}" logs -type f -newer .started ! -name '*.tmp' ! -path '*/data/*' 2>/dev/null)
tar czf "$OUT/results.tgz" "${made[@]}" snakemake.log .started 2>/dev/null
ls -la "$OUT"
grep -E "^\[|rule |Finished job|Error|error|exit" snakemake.log | tail -n 40
# the last lines of the job log written most recently: the repeats that ended on this machine, and when
job=$(find logs -type f -name '*.log' ! -name 'server-*' ! -path '*/mps-*' -newer .started -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2-)
if [ -n "$job" ]; then echo "== $job"; tail -n 4 "$job"; fi
