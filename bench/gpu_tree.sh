#!/usr/bin/env bash
# A device call carries the tracked tree beside each payload part (64 MiB in all), and the tree is mostly
# what a GPU job never reads: the benchmarks' committed logs, the figures and other profiles' results.
# `slim` takes those out of git's index and ignores them (the files stay here), so the parts can be larger
# and fewer: 2026-11-25, a 15 MiB tree and 8 stash calls of 46 MiB against 48 MiB and 29 calls of 14 MiB.
# `restore` puts them back. While slim, a pre-commit hook refuses every commit, which would delete them.
#
#   bench/gpu_tree.sh slim CONFIG...   keep the outdirs of these configs (the ones the device calls measure)
#   bench/gpu_tree.sh restore
#   bench/gpu_tree.sh status
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude) hook=$(git rev-parse --git-path hooks/pre-commit)
begin="# gpu_tree.sh slim: begin" end="# gpu_tree.sh slim: end"
py=${PYTHON:-python3}

slim_paths() {  # bench/results, paper_figures, and every config's outdir that no named config writes into
  "$py" - "$@" <<'PY'
import glob, subprocess, sys, yaml
tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
outdir = lambda cfg: (yaml.safe_load(open(cfg)) or {}).get("outdir", "results")
keep = {outdir(c) for c in sys.argv[1:]}
inside = lambda a, b: a == b or a.startswith(b + "/")
drop = {outdir(c) for c in glob.glob("config/*.yaml")} - keep
# an outdir holding a kept one (results holds results/quick-tp) stays; only its own entries go, where no kept
# outdir is in them (2026-11-27: the paper's 31 MiB of runs and calibration beside results/quick-tp)
holders = {d for d in drop if any(inside(k, d) for k in keep)}
drop -= holders
for d in holders:
    entries = {d + "/" + f[len(d) + 1:].split("/")[0] for f in tracked if inside(f, d)}
    drop |= {e for e in entries if not any(inside(k, e) for k in keep) and not any(inside(e, x) for x in drop)}
print("\n".join(["bench/results", "paper_figures", *sorted(drop)]))
PY
}

case "${1:-}" in
  slim)
    shift; [ $# -gt 0 ] || { echo "gpu_tree: name the configs the device calls measure" >&2; exit 2; }
    grep -qxF "$begin" "$exclude" 2>/dev/null && { echo "gpu_tree: already slim; restore first" >&2; exit 2; }
    git diff --cached --quiet || { echo "gpu_tree: the index has staged changes; commit them first" >&2; exit 2; }
    for cfg in "$@"; do [ -f "$cfg" ] || { echo "gpu_tree: no config file $cfg" >&2; exit 2; }; done
    out=$(slim_paths "$@")  # a failure here stops the script (set -e), unlike one inside <(...)
    mapfile -t paths <<<"$out"
    [ -n "${paths[0]:-}" ] || { echo "gpu_tree: no paths to leave out" >&2; exit 2; }
    [ -e "$hook" ] && { echo "gpu_tree: $hook exists; it is not this script's to replace" >&2; exit 2; }
    git rm -r -q --cached --ignore-unmatch -- "${paths[@]}"
    mkdir -p "$(dirname "$exclude")" "$(dirname "$hook")"
    { echo "$begin"; printf '/%s/\n' "${paths[@]}"; echo "$end"; } >>"$exclude"
    printf '#!/bin/sh\necho "bench/gpu_tree.sh slim is in effect: run bench/gpu_tree.sh restore before committing" >&2\nexit 1\n' >"$hook"
    chmod +x "$hook"
    echo "gpu_tree: left out of the device tree: ${paths[*]}";;
  restore)
    grep -qxF "$begin" "$exclude" 2>/dev/null || { echo "gpu_tree: not slim; nothing to restore"; exit 0; }
    mapfile -t paths < <(sed -n "/^$begin\$/,/^$end\$/p" "$exclude" | grep -v '^#' | sed 's|^/||; s|/$||' | grep .)
    [ ${#paths[@]} -eq 0 ] || git reset -q -- "${paths[@]}"
    sed -i "/^$begin\$/,/^$end\$/d" "$exclude"
    rm -f "$hook"
    echo "gpu_tree: restored ${paths[*]}";;
  status)
    if grep -qxF "$begin" "$exclude" 2>/dev/null; then echo "slim"; else echo "whole"; fi;;
  *) echo "usage: bench/gpu_tree.sh slim CONFIG... | restore | status" >&2; exit 2;;
esac
tree=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) || true  # a file gone here: not counted
echo "gpu_tree: the tree a device call carries: $((${tree:-0} / 1048576)) MiB tracked"
