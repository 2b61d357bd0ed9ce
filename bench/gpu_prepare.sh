#!/usr/bin/env bash
# Builds, on a fresh checkout here, everything a lent GPU host lacks (all git-ignored), in one go:
#   .gpu-wheels/               the vLLM 0.26.0 wheel set (../shared/gpu/build-wheelhouse.sh)
#   .gpu-carry/snake/          Snakemake 9.27.1 and altair with what they need that the GPU image lacks (cp312)
#   .gpu-carry/extra/          polars and the prompts every config measures with (built here by Snakemake)
#   .gpu-payload/part*+SHA256  all of it as one checked payload (bench/gpu_payload.sh pack PART_MIB)
# usage: bench/gpu_prepare.sh [PART_MIB]   (default: what fits 64 MiB beside the tracked tree, 4 MiB spare)
# First `bench/gpu_tree.sh slim CONFIG...` makes that tree (and the number of calls) smaller.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "gpu_prepare: run 'make setup' first (needs .venv for Snakemake and polars)" >&2; exit 2; }
dl=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# The GPU image's packages (device KINDS.md, "Python packages already there"): never carried, so the
# image's numpy, pyyaml or jinja2 stay the ones torch and transformers were built with.
image="jinja2 markupsafe pyyaml requests urllib3 certifi idna charset-normalizer packaging psutil attrs
  typing-extensions narwhals tabulate wrapt pandas python-dateutil six numpy pygments rich markdown-it-py mdurl
  click filelock"

[ -f .gpu-wheels/SHA256 ] || bash ../shared/gpu/build-wheelhouse.sh .gpu-wheels

if [ ! -f .gpu-carry/snake/.done ]; then
  rm -rf .gpu-carry/snake /tmp/gpu-prepare && mkdir -p .gpu-carry/snake /tmp/gpu-prepare
  # pip's closure, resolved here (Python 3.11); connection-pool is sdist-only, so pip wheel builds it
  "$py" -m pip wheel -q --wheel-dir /tmp/gpu-prepare snakemake==9.27.1 altair==6.3.0
  for whl in /tmp/gpu-prepare/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr '_' '-' | tr 'A-Z' 'a-z')
    grep -qw -- "$name" <<<"$image" && continue
    grep -qi "^$name==" ../shared/gpu/vllm-wheels.txt && continue  # installed with vLLM, in its version
    case "$whl" in
      *-py3-none-any.whl|*-py2.py3-none-any.whl) cp "$whl" .gpu-carry/snake/ ;;
      *) ver=$(basename "$whl" | cut -d- -f2); "${dl[@]}" -d .gpu-carry/snake "$name==$ver" ;;  # cp312 build
    esac
  done
  touch .gpu-carry/snake/.done
fi

mkdir -p .gpu-carry/extra
ls .gpu-carry/extra/polars-*.whl >/dev/null 2>&1 || {
  ver=$("$py" -c 'import polars; print(polars.__version__)')
  "${dl[@]}" -d .gpu-carry/extra "polars==$ver"
  for dep in $(unzip -p .gpu-carry/extra/polars-"$ver"-*.whl '*/METADATA' | grep -v extra | sed -n 's/^Requires-Dist: \(polars[-_]runtime[^ ;]*\).*/\1/p' | tr -d ' '); do
    "${dl[@]}" -d .gpu-carry/extra "$dep"
  done
}
# The prompts each config measures with (slmserve.layout's "prompts" path of its outdir), built here
for cfg in config/quick.yaml config/config.yaml; do
  f=$(PYTHONPATH=src "$py" - "$cfg" <<'PY'
import sys, yaml
from slmserve.layout import Layout
base = yaml.safe_load(open("config/config.yaml"))
cfg = yaml.safe_load(open(sys.argv[1]))  # a profile extends config/config.yaml, as the Snakefile reads it
wl = {**base["workload"], **cfg.get("workload", {})}
layout = Layout(outdir=cfg.get("outdir", base["outdir"]))
print(layout.path("prompts", input_len=wl["input_len"], num_requests=wl["num_requests"]))
PY
)
  [ -f "$f" ] || "$py" -m snakemake "$f" --configfile "$cfg" --cores 2 --resources gpu=1 -q \
    --config allow_cpu=True  # only the prompts: no engine runs here
  cp "$f" .gpu-carry/extra/
done

# The committed results travel with the tree (gpu_dag.sh resumes from them), so no resume.tgz: carrying them
# twice made every part 9 MiB smaller (2026-11-25: 26 calls for what fits 18). One left over would be stale.
rm -f .gpu-carry/resume.tgz
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
# 4 MiB spare: a machine's results copied in before the next machine's calls (2.1 MiB on 2026-11-26) travel too
mib=${1:-$(( (64 * 1048576 - tree - 4 * 1048576) / 1048576 ))}
# below 8 MiB a part the payload takes over 50 calls: slim the tree instead (or give PART_MIB on purpose)
[ "$mib" -ge 8 ] || { echo "gpu_prepare: the tracked tree ($((tree / 1048576)) MiB) leaves $mib MiB of a call's" \
  "64 MiB for a part; run 'bash bench/gpu_tree.sh slim CONFIG...' first" >&2; exit 2; }
bash bench/gpu_payload.sh pack "$mib"
echo "gpu_prepare: tree $((tree / 1048576)) MiB + parts of $mib MiB per call;" \
  "$(ls .gpu-payload/part* | wc -l) parts: $(($(ls .gpu-payload/part* | wc -l) - 1)) stash calls, then the install"
