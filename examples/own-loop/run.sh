#!/usr/bin/env bash
# The seed article's run, recorded: OUT/good/ holds the accumulation and DDP traces of the
# article's script, OUT/mistake/ the same DDP trace beside the accumulation run that forgets to
# divide the loss. Then:  ddp-verify compare OUT/good   (EQUIVALENT)
#                         ddp-verify compare OUT/mistake (NOT EQUIVALENT)
#   examples/own-loop/run.sh [OUT]     (OUT default out/own-loop, relative to the current directory)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-out/own-loop}
# The project's .venv (scripts/setup.sh installs the recorder there), else what is on PATH.
python=python3 torchrun=torchrun
[ -x "$root/.venv/bin/python" ] && python=$root/.venv/bin/python
[ -x "$root/.venv/bin/torchrun" ] && torchrun=$root/.venv/bin/torchrun
# torchrun warns without it; the article's 8x8 model needs no threads.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The article's run: 8 rows, micro-batches of 4, two ranks or two accumulated micro-batches.
flags=(--epochs 2 --batch_size 4 --data_size 8 --acc_steps 2 --verbose --force)

mkdir -p "$out/good" "$out/mistake"
"$python" "$here/accumulation.py" "${flags[@]}" --out "$out/good"
"$torchrun" --standalone --nproc_per_node=2 "$here/ddp.py" "${flags[@]}" --out "$out/good"
"$python" "$here/accumulation_mistake.py" "${flags[@]}" --out "$out/mistake"
# The mistake is compared with the same DDP run.
ln -sfn ../good/ddp.safetensors "$out/mistake/ddp.safetensors"
echo "run.sh: traces in $out/good and $out/mistake; compare each with: ddp-verify compare DIR"
