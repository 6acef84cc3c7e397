#!/usr/bin/env bash
# Builds the `ddp-verify` wheel (python/pyproject.toml: the `ddp-verify` binary without libtorch,
# stripped, the wheel profile (release settings), and the ddp_verify_trace recorder) into target/wheels, checks it
# and prints its size, then its path as the last line:
#   scripts/check-wheel.sh "$(scripts/build-wheel.sh | tail -n 1)" .venv/bin/python
#
#   scripts/build-wheel.sh            # zig links against glibc 2.17: manylinux_2_17 (manylinux2014)
#   scripts/build-wheel.sh --native   # this machine's linker: manylinux_2_34 on glibc >= 2.34, as
#                                     # Rust's std then links __libc_start_main@GLIBC_2.34
#
# maturin and zig (ziglang) come from PyPI into .venv-build, pinned; cargo and a C linker come
# from the machine (no libtorch, Open MPI or CUDA is needed). maturin's auditwheel check
# (`--auditwheel check`) fails the build where the binary needs a library or a glibc symbol
# the manylinux tag does not allow.
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_VERSION=1.16.0
ZIG_VERSION=0.15.2
tools=.venv-build

native=""
case "${1:-}" in
  "") ;;
  --native) native=1 ;;
  *) echo "usage: scripts/build-wheel.sh [--native]" >&2; exit 2 ;;
esac

if ! "$tools/bin/python" -c "
import importlib.metadata as m
assert m.version('maturin') == '$MATURIN_VERSION' and m.version('ziglang') == '$ZIG_VERSION'" 2>/dev/null; then
  echo "build-wheel: installing maturin==$MATURIN_VERSION and ziglang==$ZIG_VERSION into $tools (uv)"
  # shellcheck source=scripts/uv.sh
  . scripts/uv.sh
  uv_install "$tools/bin/python" "maturin==$MATURIN_VERSION" "ziglang==$ZIG_VERSION"
fi

out=target/wheels
mkdir -p "$out"
rm -f "$out"/ddp_verify-*.whl
if [ -n "$native" ]; then
  link=()
else
  # maturin runs zig as `python3 -m ziglang`, from the tools venv.
  link=(--zig --compatibility manylinux_2_17)
fi
start=$(date +%s)
# The wheel profile (release settings), stripping and the features are python/pyproject.toml's [tool.maturin].
# Its own target directory: target/release/ddp-verify stays the full build's (tests/hosts runs it).
(cd python && PATH="$PWD/../$tools/bin:$PATH" CARGO_TARGET_DIR="$PWD/../target/wheel" "../$tools/bin/maturin" build \
  --auditwheel check "${link[@]}" --out "../$out")
seconds=$(( $(date +%s) - start ))

wheels=("$out"/ddp_verify-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "build-wheel: expected one wheel in $out" >&2; exit 1; }
wheel=$(realpath "${wheels[0]}")
# The binary inside, as pip will install it (its size unpacked, its glibc needs).
"$tools/bin/python" - "$wheel" "$seconds" <<'EOF'
import sys, zipfile
wheel, seconds = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
bins = [i for i in z.infolist() if "/scripts/" in i.filename]
assert [b.filename.rsplit("/", 1)[1] for b in bins] == ["ddp-verify"], f"the wheel's scripts: {bins}"
assert any(i.filename == "ddp_verify_trace/autoload/sitecustomize.py" for i in z.infolist())
size = sum(i.file_size for i in z.infolist())
print(f"build-wheel: {seconds} s; {wheel.rsplit('/', 1)[1].rsplit('-', 1)[1].removesuffix('.whl')} "
      f"({sum(1 for _ in z.infolist())} files, {size / 1e6:.1f} MB unpacked, "
      f"binary {bins[0].file_size / 1e6:.1f} MB)")
EOF
echo "build-wheel: $(du -k "$wheel" | cut -f1) KiB; the wheel's path is the last line"
echo "$wheel"
