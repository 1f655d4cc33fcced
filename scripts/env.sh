# shellcheck shell=bash
# Source this file (`. scripts/env.sh`) to work ON nsq_sync: it puts the project's tools on PATH,
# the clone's development .venv first (so `python`, `pip install` afterwards are that venv's;
# to only run nsqd/nsqlookupd, `export PATH="$PWD/.nsq/bin:$PATH"` instead):
#   - .venv/bin first (python, pytest, tox, ruff, mypy from scripts/bootstrap);
#   - the newest pyenv CPython 3.9 ... 3.13 bin folders, so that tox finds python3.9 ... python3.13
#     directly instead of through pyenv shims (which fail for versions not selected by pyenv);
#   - NSQ_BIN=<repo>/.nsq/bin unless NSQ_BIN is already set, and that folder on PATH too (nsqd,
#     nsqlookupd, as docs/quickstart.md starts them; after .venv/bin).
# Safe to source more than once: folders already on PATH are not added again.

_nsq_sync_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"

_nsq_sync_path_prepend() {
  case ":${PATH}:" in
    *":$1:"*) ;;
    *) PATH="$1${PATH:+:$PATH}" ;;
  esac
}

_nsq_sync_pyenv_root=""
if command -v pyenv >/dev/null 2>&1; then
  _nsq_sync_pyenv_root="$(pyenv root 2>/dev/null || true)"
elif [ -d "${PYENV_ROOT:-$HOME/.pyenv}/versions" ]; then
  _nsq_sync_pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
fi
if [ -n "$_nsq_sync_pyenv_root" ]; then
  # Newest patch release of each minor version; plain CPython builds only (not 3.13t, -dev, pypy).
  for _nsq_sync_minor in 13 12 11 10 9; do
    _nsq_sync_dir="$(find "$_nsq_sync_pyenv_root/versions" -mindepth 1 -maxdepth 1 \
      -regex ".*/3\.${_nsq_sync_minor}\.[0-9]+" 2>/dev/null | sort -V | tail -n 1)"
    if [ -n "$_nsq_sync_dir" ] && [ -x "$_nsq_sync_dir/bin/python3.${_nsq_sync_minor}" ]; then
      _nsq_sync_path_prepend "$_nsq_sync_dir/bin"
    fi
  done
fi
export NSQ_BIN="${NSQ_BIN:-$_nsq_sync_root/.nsq/bin}"
_nsq_sync_path_prepend "$NSQ_BIN"
# Prepended last, so it comes first.
_nsq_sync_path_prepend "$_nsq_sync_root/.venv/bin"
export PATH

unset -f _nsq_sync_path_prepend
unset _nsq_sync_root _nsq_sync_pyenv_root _nsq_sync_minor _nsq_sync_dir
