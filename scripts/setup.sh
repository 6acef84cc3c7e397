#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine; safe to run again (it skips what is done).
#  - Open MPI (the CPU collective engine and rank launcher) and clang (bindgen for rsmpi)
#  - iproute2 (`ip netns`), for the two-hosts test (tests/hosts/two_hosts.sh)
#  - a project-local virtualenv .venv with PyTorch 2.13.0 from PyPI: libtorch for tch 0.26,
#    and the fixtures' reference scripts
#  - the ddp_verify_trace recorder: python/ on .venv's path (a .pth file), its dependencies and
#    pytest for its tests
#  - the frameworks the examples run under (Transformers, Accelerate, Lightning, DeepSpeed; ~30 s)
#  - .libtorch -> the wheel's torch directory, which .cargo/config.toml points LIBTORCH at
#  - libnccl.so beside the wheel's libnccl.so.2, the name cudarc opens for GPU runs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/uv.sh
. scripts/uv.sh

need_apt=()
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev openmpi-bin)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v clang >/dev/null && [ -n "$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null)" ] || need_apt+=(libclang-dev clang)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${need_apt[*]} (apt)"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

if ! .venv/bin/python -W ignore -c 'import torch, torchvision, safetensors; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
  echo "setup: installing torch==2.13.0 into .venv (uv, about 30 s)"
  python3 -m venv .venv
  uv_install .venv/bin/python -r fixtures/requirements.txt
fi

# The recorder: .venv runs python/'s source through a .pth file naming this checkout's python/
# (not `pip install -e ./python`: python/pyproject.toml builds the `ddp-verify` wheel, whose Rust
# binary cargo builds here anyway), with the dependencies python/pyproject.toml declares and pytest.
# Done where either is missing, or the recorder imported is another checkout's.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! .venv/bin/python -W ignore -c '
import os, re, importlib.metadata as m, ddp_verify_trace, pytest
try: import tomllib
except ImportError: from pip._vendor import tomli as tomllib  # Python < 3.11
assert os.path.realpath(ddp_verify_trace.__file__) == os.path.realpath("python/ddp_verify_trace/__init__.py")
for line in open("python/requirements-test.txt"):
    line = line.split("#")[0].strip()
    if line:
        assert m.version(line.split("==")[0]) == line.split("==")[1], line
for dep in tomllib.load(open("python/pyproject.toml", "rb"))["project"]["dependencies"]:
    m.version(re.match(r"[\w.-]+", dep)[0])' 2>/dev/null; then
  echo "setup: putting the ddp_verify_trace recorder (python/) on .venv's path; its dependencies and pytest"
  # An editable install of the recorder's earlier setuptools package (ddp-verify-trace) goes.
  if compgen -G "$site/ddp_verify_trace-*.dist-info" >/dev/null; then
    .venv/bin/pip uninstall -y -q --disable-pip-version-check ddp-verify-trace
  fi
  mapfile -t deps < <(.venv/bin/python -c '
try: import tomllib
except ImportError: from pip._vendor import tomli as tomllib  # Python < 3.11
print(*tomllib.load(open("python/pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
  uv_install .venv/bin/python -r python/requirements-test.txt "${deps[@]}"
  realpath python > "$site/ddp_verify_trace_checkout.pth"
fi

# Exactly the pinned framework versions, or they are installed again.
if ! .venv/bin/python -W ignore -c '
import importlib.metadata as m
for line in open("python/requirements-frameworks.txt"):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert m.version(name) == version, name' 2>/dev/null; then
  echo "setup: installing the examples' frameworks into .venv (uv, about 10 s)"
  uv_install .venv/bin/python -r python/requirements-frameworks.txt
fi

torch_dir=$(.venv/bin/python -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')
ln -sfn "$torch_dir" .libtorch
# cudarc opens NCCL as libnccl.so; the wheel ships only libnccl.so.2 (build.rs adds the rpath).
nccl_dir="$torch_dir/../nvidia/nccl/lib"
if [ -e "$nccl_dir/libnccl.so.2" ] && [ ! -e "$nccl_dir/libnccl.so" ]; then
  ln -s libnccl.so.2 "$nccl_dir/libnccl.so"
fi
echo "setup: libtorch at $torch_dir"
