#!/usr/bin/env bash
# Create (once) the virtual environment of the real-framework tests and print its python.
#
# The venv lives outside the clone, in ${TRAINPLAN_VENV_ROOT:-$HOME/.cache/trainplan}/venv-<hash>,
# where <hash> is the first 12 hex digits of sha256(requirements.txt): a changed pin makes a new
# venv, an unchanged one is reused by every clone and CI run on the machine. A venv is only used
# once its install finished (the `.complete` marker), so an interrupted install is redone.
#
# Exit 0 and the python path on stdout when the venv is ready; exit 3 with a message on stderr
# when the package registry cannot be reached (the tests then skip, saying so); any other
# failure exits 1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements.txt"
hash="$(sha256sum "$req" | cut -c1-12)"
root="${TRAINPLAN_VENV_ROOT:-$HOME/.cache/trainplan}"
venv="$root/venv-$hash"
if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$root"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
  echo "venv.sh: $py is missing or older than 3.10" >&2
  exit 1
fi
if ! "$py" -m pip download --no-deps --quiet -d "$(mktemp -d)" six==1.16.0 >/dev/null 2>&1; then
  echo "venv.sh: the package registry is unreachable: framework tests cannot install their wheels" >&2
  exit 3
fi
rm -rf "$venv"
"$py" -m venv "$venv"
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet -r "$req" >&2
touch "$venv/.complete"
echo "venv.sh: installed $req into $venv in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin/python"
