"""Zero-edit recording, started by `autoload/sitecustomize.py` from the environment
`ddp-verify -- python train.py` sets for each leg:

  DDP_VERIFY_TRACE             where this leg's trace goes (rank 0 writes it)
  DDP_VERIFY_LEG               accumulation, ddp or big-batch
  DDP_VERIFY_ACC_STEPS         K over all ranks
  DDP_VERIFY_LOCAL_ACC_STEPS   micro-batches per optimizer step in this process (K, or K/W)
  DDP_VERIFY_WORLD             the DDP world size the legs compare against
  DDP_VERIFY_MAGNITUDES        optional: tensor (default), element or false
  DDP_VERIFY_SAMPLE            optional: auto (default), full, or N positions kept per tensor
                               (`--sample`; read by record())
  DDP_VERIFY_PROGRESS          optional: a file rank 0 keeps its optimizer steps in, for
                               ddp-verify's progress line (`_progress`)
  DDP_VERIFY_PERTURB           the control leg only: each step's gradients nudged by this
                               fraction of each tensor's largest |g| (`_perturb`)
  DDP_VERIFY_NO_DROPOUT        optional: 1 (`--no-dropout`): every dropout of the run is the
                               identity, said in the header's dropout_off (`_no_dropout`)
  DDP_VERIFY_DEVICE            optional: cpu (`--device cpu`): the script's hard-coded CUDA and
                               NCCL run on the CPU with gloo, said in the header's
                               device_mapped; what has no CPU meaning raises one line
                               (`_cpu_device`)
  DDP_VERIFY_STEP_FILE         optional (`watch --stop-on-fault`): a folder rank 0 writes each
                               step's small trace into, judged while the run trains
                               (`_step_file`)

Those two are read by the patches `record()` installs (`_torch_patches`), at start-up, before
the script runs; a value other than those is refused there. A setting `record()` refuses
raises here, at start-up, never inside the script's training: Python reports it ("Error in
sitecustomize", then the error's one line) and runs the script unrecorded, and ddp-verify
then quotes that line (exit 2).
"""
from __future__ import annotations

import os

from . import _schema
from .session import Session


def start() -> Session:
    import ddp_verify_trace

    env = os.environ
    meta = {_schema.Key.LEG: env.get("DDP_VERIFY_LEG", "")}
    acc = env.get("DDP_VERIFY_ACC_STEPS")
    session = ddp_verify_trace.record(env["DDP_VERIFY_TRACE"], overwrite=True, acc_steps=int(acc) if acc else None)
    session._meta.update({k: v for k, v in meta.items() if v})
    return session
