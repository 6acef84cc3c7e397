# Sourced by the set-up scripts: `uv_install PYTHON ARGS...` installs into PYTHON's venv with uv
# (pinned, from PyPI into .venv-build beside maturin and zig), not pip: its downloads run in
# parallel and one wheel cache (~/.cache/uv, or UV_CACHE_DIR) is hardlinked into every venv,
# so a wheel two venvs share costs neither a download nor its disk twice. Measured on 2 cores:
# .venv's torch 2.13 and frameworks 39 s (pip: about 4 minutes), .venv-torch25 50 s (pip:
# 239 s), the same versions resolved (their `pip freeze` alike).
# Venvs are still made by `python3 -m venv`, with a pip of their own where they had one: users'
# commands and scripts/check-wheel.sh run pip there, as a user would.
UV_VERSION=0.13.9
uv_bin=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-build/bin/uv

# uv_ready: uv installed at UV_VERSION (before background jobs share it).
uv_ready() {
  if ! [ -x "$uv_bin" ] || [ "$("$uv_bin" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    [ -x "${uv_bin%/uv}/python" ] || python3 -m venv "${uv_bin%/bin/uv}"
    "${uv_bin%/uv}/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
  fi
}

uv_install() {
  uv_ready
  local python=$1
  shift
  # Bytecode compiled at install, as pip does: uv leaves it out by default, and a process run
  # with -B (multiprocessing's spawn) then compiles every module it imports from source,
  # import torch taking 7 s of CPU in place of 3.5 s.
  "$uv_bin" pip install -q --compile-bytecode --python "$python" "$@"
}
