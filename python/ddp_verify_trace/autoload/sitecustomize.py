"""Loaded by Python at start-up where this folder is on PYTHONPATH (`ddp-verify -- python
train.py` puts it there): records the script's training to $DDP_VERIFY_TRACE with no edit
to the script. Any sitecustomize the environment had is run first."""
import os
import sys


def _chain():
    # The sitecustomize this one shadows, if the environment has one further down the path.
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_ddp_verify_shadowed_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
if os.environ.get("DDP_VERIFY_TRACE"):
    from ddp_verify_trace.auto import start

    start()
