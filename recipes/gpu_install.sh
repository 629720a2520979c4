#!/usr/bin/env bash
# Installs mgrpo_verl and its GPU set from a wheelhouse (recipes/gpu_wheelhouse.sh) with no network:
# `pip install --no-index --find-links <wheelhouse> --no-deps` of exactly the locked versions.
#
#   bash recipes/gpu_install.sh --wheelhouse DIR [--venv DIR] [--python PY] [--isolated] [--skip 'nvidia-*']
#
#   --wheelhouse  the folder gpu_wheelhouse.sh built (requirements.lock, target.txt, the wheels)
#   --venv        the virtual environment to install into (default .venv-gpu); created when missing
#   --python      the interpreter that creates it (default python3); its X.Y must be the wheelhouse's
#   --isolated    create the venv without the image's packages (default: --system-site-packages)
#   --skip        comma-separated names or globs of locked packages the image provides in its own way
#                 (e.g. a torch built with its CUDA libraries inside): neither installed nor checked
#
# The venv sees the image's packages (--system-site-packages), so a locked package that the image has at
# the locked version is kept, e.g. the image's torch 2.11.0+cu130 for torch==2.11.0: nothing is
# reinstalled. A package the image has at another version gets the locked version inside the venv, which
# shadows the image's copy without touching it. transformers: an image with 5.17 is outside verl 0.9.1's
# declared range (>=5.5.3,<5.11,!=5.6.0), so the venv gets the lock's 5.9.0 (vllm; 5.8.1 for sglang)
# and python in the venv imports that one; the image's 5.17 stays for everything outside the venv.
# Afterwards every locked package must be importable at its locked version, and mgrpo_verl and verl must
# import.
set -euo pipefail

WH=""; VENV=".venv-gpu"; PY=python3; ISOLATED=0; SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) WH="$2"; shift 2;;
    --venv) VENV="$2"; shift 2;;
    --python) PY="$2"; shift 2;;
    --isolated) ISOLATED=1; shift;;
    --skip) SKIP="$2"; shift 2;;
    -h|--help) sed -n '2,21p' "$0"; exit 0;;
    *) echo "gpu_install: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
[ -n "$WH" ] || { echo "gpu_install: --wheelhouse DIR is required" >&2; exit 2; }
for f in requirements.lock target.txt; do
  [ -f "$WH/$f" ] || { echo "gpu_install: $WH/$f is missing: build the folder with recipes/gpu_wheelhouse.sh" >&2; exit 1; }
done
OWN="$(ls "$WH"/mgrpo_verl-*.whl 2>/dev/null | head -n 1)"
[ -n "$OWN" ] || { echo "gpu_install: no mgrpo_verl wheel in $WH" >&2; exit 1; }
want_py="$(sed -n 's/^python=//p' "$WH/target.txt")"

if [ ! -x "$VENV/bin/python" ]; then
  site=--system-site-packages; [ "$ISOLATED" = 1 ] && site=""
  echo "gpu_install: creating $VENV ${site:-(isolated)}"
  "$PY" -m venv $site "$VENV"
fi
VPY="$(cd "$VENV" && pwd)/bin/python"
# -I: never the current folder on sys.path (a checkout there would pass for the installed mgrpo_verl)
have_py="$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$have_py" = "$want_py" ] || { echo "gpu_install: $WH was built for Python $want_py, $VPY is $have_py (rebuild it with gpu_wheelhouse.sh --python $have_py)" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1

# plan: which locked packages to install (absent or at another version), which the environment has
plan="$(mktemp)"; trap 'rm -f "$plan"' EXIT
"$VPY" -I - "$WH" "$SKIP" "$plan" <<'EOF'
import fnmatch, re, sys
from importlib import metadata
from pathlib import Path

wh, skip, plan = Path(sys.argv[1]), [s.strip() for s in sys.argv[2].split(",") if s.strip()], Path(sys.argv[3])
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
wheels = {(norm(p.name.split("-")[0]), p.name.split("-")[1]) for p in wh.glob("*.whl")}
install, missing, kept = [], [], 0
for line in (wh / "requirements.lock").read_text().split():
    name, version = line.split("==")
    if any(fnmatch.fnmatch(name, norm(s)) for s in skip):
        print(f"gpu_install: skip {name} (--skip)")
        continue
    try:
        dist = metadata.distribution(name)
        have, where = dist.version, str(dist.locate_file(""))
    except metadata.PackageNotFoundError:
        have, where = None, ""
    if have is not None and have.split("+")[0] == version.split("+")[0]:
        kept += 1
        continue
    if (name, version) not in wheels:
        missing.append(f"{name}=={version}" + (f" (found {have})" if have else ""))
        continue
    if have is not None:
        note = " (verl 0.9.1 requires transformers>=5.5.3,<5.11,!=5.6.0)" if name == "transformers" else ""
        shadow = "" if where.startswith(sys.prefix) else f"; the venv's copy shadows {where}, which is left as it is"
        print(f"gpu_install: {name} {have} -> {version}{note}{shadow}")
    install.append(line)
if missing:
    sys.exit("gpu_install: these locked packages are neither installed here nor in the wheelhouse (left out with "
             "gpu_wheelhouse.sh --exclude?): " + ", ".join(missing))
plan.write_text("".join(f"{r}\n" for r in install))
print(f"gpu_install: {kept} locked packages already present, {len(install)} to install")
EOF
if [ -s "$plan" ]; then
  "$VPY" -I -m pip install -q --no-index --find-links "$WH" --no-deps -r "$plan"
fi
# our own wheel always: an installed mgrpo_verl of the same version number may be other code
"$VPY" -I -m pip install -q --no-index --no-deps --force-reinstall "$OWN"

"$VPY" -I - "$WH" "$SKIP" <<'EOF'
import fnmatch, re, sys
from importlib import metadata
from pathlib import Path

wh, skip = Path(sys.argv[1]), [s.strip() for s in sys.argv[2].split(",") if s.strip()]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
wrong = []
for line in (wh / "requirements.lock").read_text().split():
    name, version = line.split("==")
    if any(fnmatch.fnmatch(name, norm(s)) for s in skip):
        continue
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != version.split("+")[0]:
        wrong.append(f"{name}: locked {version}, seen {have}")
if wrong:
    sys.exit("gpu_install: the venv does not see the locked versions: " + "; ".join(wrong))
EOF
"$VPY" -I -c 'import mgrpo_verl, verl, transformers, torch; print(f"gpu_install: ok: mgrpo_verl from {mgrpo_verl.__path__[0]}, verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
echo "gpu_install: run with $VPY -m mgrpo_verl.main_ppo ..."
