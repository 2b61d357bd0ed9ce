#!/usr/bin/env bash
# Carries what the offline GPU host lacks (vLLM 0.26.0 wheel set, Snakemake's wheels, polars, the prompts)
# in parts small enough for one device call each: a call carries at most 64 MiB with the tracked tree.
#
#   here:     bench/gpu_payload.sh pack [PART_MIB]   .gpu-wheels/ + .gpu-carry/{snake,extra} -> .gpu-payload/
#   on host:  bench/gpu_payload.sh stash             copy the parts carried this call to /root/payload-parts
#   on host:  bench/gpu_payload.sh install           join, check SHA-256, unpack, install vLLM into /tmp/vllm-site
#
# After install, GPU_CARRY=/tmp/payload bash bench/gpu_dag.sh ... installs Snakemake and polars from
# /tmp/payload/{snake,extra} (its usual step) and finds the prompts there.
set -euo pipefail
mode=${1:?pack, stash or install}
store=/root/payload-parts
case "$mode" in
  pack)
    mib=${2:-48}
    rm -rf .gpu-payload /tmp/payload-pack && mkdir -p .gpu-payload /tmp/payload-pack
    cat .gpu-wheels/part* >/tmp/payload-pack/wheels.tar
    (cd /tmp/payload-pack && sha256sum -c "$OLDPWD/.gpu-wheels/SHA256")
    cp -r .gpu-carry/snake .gpu-carry/extra /tmp/payload-pack/
    tar cf /tmp/payload.tar -C /tmp/payload-pack .
    (cd .gpu-payload && split -b "${mib}M" -d -a 2 /tmp/payload.tar part && sha256sum /tmp/payload.tar >SHA256)
    rm -rf /tmp/payload-pack /tmp/payload.tar
    ls -la .gpu-payload;;
  stash)
    mkdir -p "$store" && cp .gpu-payload/part* .gpu-payload/SHA256 "$store"/ 2>/dev/null || true
    echo "stashed: $(ls "$store" | tr '\n' ' ')";;
  install)
    mkdir -p "$store" && cp .gpu-payload/part* .gpu-payload/SHA256 "$store"/ 2>/dev/null || true
    if [ -d /tmp/vllm-site/vllm ] && [ -d /tmp/payload/snake ]; then echo "already installed"; exit 0; fi
    cat "$store"/part* >/tmp/payload.tar && sha256sum -c "$store/SHA256"
    rm -rf /tmp/payload && mkdir -p /tmp/payload/vllm && tar xf /tmp/payload.tar -C /tmp/payload
    tar xf /tmp/payload/wheels.tar -C /tmp/payload/vllm && rm /tmp/payload.tar /tmp/payload/wheels.tar
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vllm-site \
      /tmp/payload/vllm/*.whl
    # byte-compiled once here (16 cores) rather than by each server process, since the image sets
    # PYTHONDONTWRITEBYTECODE=1; the image's own packages too where it lacks their .pyc
    img=$(python3 -c 'import importlib.util as u
for n in ("torch", "transformers", "triton", "huggingface_hub", "numpy"):
    s = u.find_spec(n)
    if s and s.submodule_search_locations: print(s.submodule_search_locations[0])')
    for d in /tmp/vllm-site $img; do
      before=$(find "$d" -name '*.pyc' | wc -l)
      t0=$(date +%s); [ -w "$d" ] && { python3 -m compileall -q -j 0 "$d" >/dev/null 2>&1 || true; }
      echo "byte-compiled $d in $(( $(date +%s) - t0 )) s: $(find "$d" -name '*.py' | wc -l) modules," \
        ".pyc $before before, $(find "$d" -name '*.pyc' | wc -l) after"
    done
    echo "installed $(ls /tmp/payload/vllm | wc -l) vLLM wheels into /tmp/vllm-site; Snakemake, polars and" \
      "the prompts are in /tmp/payload for bench/gpu_dag.sh";;
  *) echo "unknown mode $mode (pack, stash, install)" >&2; exit 2;;
esac
