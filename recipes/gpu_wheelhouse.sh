#!/usr/bin/env bash
# Builds a wheelhouse for installing mgrpo_verl[vllm] (or [sglang]) on an air-gapped GPU machine: run it
# where PyPI is reachable, copy the folder over, run recipes/gpu_install.sh there.
#
#   bash recipes/gpu_wheelhouse.sh [--out DIR] [--python 3.12] [--glibc 2.35] [--extra vllm]
#                                  [--exclude 'torch,triton,nvidia-*'] [--exclude-present PY]
#                                  [--constraint FILE] [--list]
#
#   --out         the wheelhouse folder (default: wheelhouse-py<python>-<extra>)
#   --python      the target machine's Python X.Y (default 3.12; 3.11 and 3.12 are supported)
#   --glibc       the target's glibc (`ldd --version`; default 2.35 = Ubuntu 22.04): every manylinux tag
#                 up to it is accepted (recipes/pip_target.py explains why one --platform is not enough)
#   --extra       the rollout engine's extra (pyproject.toml): vllm (default) or sglang; any other extra
#                 of pyproject.toml, or none, for a wheelhouse of another set
#   --exclude     comma-separated names or globs left out of the wheelhouse because the target image has
#                 them at the locked version (torch 2.11.0 alone is 531 MB, its CUDA libraries ~3 GB);
#                 they stay in the lock, and gpu_install.sh checks the image has them
#   --exclude-present  an interpreter of the target image (e.g. a connected node with the same image):
#                 every locked package it has at the locked version is left out of the wheelhouse
#                 (except pip, setuptools and wheel: a new venv has its own, which hide the image's)
#   --constraint  a pip constraints file for the resolution (e.g. the image's `pip freeze`, to keep its
#                 versions where verl allows them)
#   --list        resolve and write the lock only; downloads no wheel (metadata only)
#
# Steps: our own wheel (`pip wheel --no-deps .`); wheels of the pure-Python packages PyPI ships as source
# only (antlr4-python3-runtime for hydra-core); one resolution of `mgrpo_verl[EXTRA]` for the target with
# pip 26.3 reading metadata only (report.json); requirements.lock = every package of it, name==version;
# then `pip download --no-deps --only-binary=:all:` of the lock for the target. The folder also gets
# target.txt (python, glibc, extra), which gpu_install.sh checks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
TARGET_PY=3.12; GLIBC=2.35; EXTRA=vllm; OUT=""; EXCLUDE=""; PRESENT=""; CONSTRAINT=""; LIST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2;;
    --python) TARGET_PY="$2"; shift 2;;
    --glibc) GLIBC="$2"; shift 2;;
    --extra) EXTRA="$2"; shift 2;;
    --exclude) EXCLUDE="$2"; shift 2;;
    --exclude-present) PRESENT="$2"; shift 2;;
    --constraint) CONSTRAINT="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2;;
    --list) LIST=1; shift;;
    -h|--help) sed -n '2,31p' "$0"; exit 0;;
    *) echo "gpu_wheelhouse: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
case "$TARGET_PY" in 3.11|3.12) ;; *) echo "gpu_wheelhouse: --python must be 3.11 or 3.12 (verl 0.9.1 and vllm 0.24.0), got $TARGET_PY" >&2; exit 2;; esac
"$PY" -c 'import sys, tomllib; extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
if sys.argv[2] not in {*extras, "none"}:
    sys.stderr.write(f"gpu_wheelhouse: --extra must be one of {sorted(extras)} or none, got {sys.argv[2]!r}\n")
    sys.exit(2)' \
  "$ROOT/pyproject.toml" "$EXTRA"
OUT="${OUT:-wheelhouse-py$TARGET_PY-$EXTRA}"
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
export PIP_DISABLE_PIP_VERSION_CHECK=1
TARGET=(--python "$TARGET_PY" --glibc "$GLIBC" --cache "${MGRPO_PIP_CACHE:-$OUT/.pip}")

echo "gpu_wheelhouse: our wheel"
rm -f "$OUT"/mgrpo_verl-*.whl
# from a clean copy of the sources: setuptools reuses a checkout's build/ folder, and a module deleted
# since the last build would still be packed
src="$(mktemp -d)"; trap 'rm -rf "$src"' EXIT
"$PY" -c 'import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))' \
  "$ROOT/mgrpo_verl" "$src/mgrpo_verl"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$src/"
"$PY" -m pip wheel -q --no-deps -w "$OUT" "$src"
OWN="$(ls "$OUT"/mgrpo_verl-*.whl)"
"$PY" "$ROOT/recipes/pip_target.py" "${TARGET[@]}" --sdist-wheels "$OUT"

echo "gpu_wheelhouse: resolving mgrpo_verl[$EXTRA] for Python $TARGET_PY, glibc $GLIBC (metadata only)"
resolve=(install --dry-run --ignore-installed --quiet --report "$OUT/report.json" --find-links "$OUT")
[ -n "$CONSTRAINT" ] && resolve+=(--constraint "$CONSTRAINT")
want="mgrpo_verl[$EXTRA]"; [ "$EXTRA" = none ] && want=mgrpo_verl
"$PY" "$ROOT/recipes/pip_target.py" "${TARGET[@]}" -- "${resolve[@]}" "$want @ file://$OWN"

present="{}"
if [ -n "$PRESENT" ]; then
  present="$("$PRESENT" -c 'import json; from importlib import metadata
print(json.dumps({d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}))')"
fi

"$PY" - "$OUT" "$EXCLUDE" "$present" <<'EOF'
import fnmatch, json, re, sys
from pathlib import Path

out, exclude = Path(sys.argv[1]), [p.strip().lower() for p in sys.argv[2].split(",") if p.strip()]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
# a new venv brings its own pip and setuptools (3.11), which hide the image's: those are always fetched
present = {(norm(n), v.split("+")[0]) for n, v in json.loads(sys.argv[3]).items()}
present = {(n, v) for n, v in present if n not in ("pip", "setuptools", "wheel")}
pins = sorted((norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in json.loads((out / "report.json").read_text())["install"])
pins = [(n, v) for n, v in pins if n != "mgrpo-verl"]
(out / "requirements.lock").write_text("".join(f"{n}=={v}\n" for n, v in pins))
have = {(norm(p.name.split("-")[0]), p.name.split("-")[1]) for p in out.glob("*.whl")}
fetch = [(n, v) for n, v in pins if (n, v) not in have and (n, v.split("+")[0]) not in present and not any(fnmatch.fnmatch(n, norm(x)) for x in exclude)]
(out / "download.txt").write_text("".join(f"{n}=={v}\n" for n, v in fetch))
left = [n for n, _ in pins if any(fnmatch.fnmatch(n, norm(x)) for x in exclude)]
kept = sum((n, v.split("+")[0]) in present for n, v in pins)
print(f"gpu_wheelhouse: {len(pins)} packages locked in {out / 'requirements.lock'}; {len(fetch)} to download"
      + (f"; {kept} present in the image" if present else "")
      + (f"; excluded (the image must have them): {', '.join(left)}" if left else ""))
EOF
printf 'python=%s\nglibc=%s\nextra=%s\n' "$TARGET_PY" "$GLIBC" "$EXTRA" > "$OUT/target.txt"

if [ "$LIST" = 1 ]; then
  grep -E '^(torch|vllm|sglang|transformers|verl)==' "$OUT/requirements.lock" | tr '\n' ' '; echo
  echo "gpu_wheelhouse: --list: nothing downloaded"
  exit 0
fi
if [ -s "$OUT/download.txt" ]; then
  echo "gpu_wheelhouse: downloading $(wc -l < "$OUT/download.txt") wheels into $OUT"
  "$PY" "$ROOT/recipes/pip_target.py" "${TARGET[@]}" -- download --quiet --no-deps -d "$OUT" -r "$OUT/download.txt"
fi
echo "gpu_wheelhouse: done: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT; copy it to the GPU machine and run recipes/gpu_install.sh --wheelhouse <it>"
