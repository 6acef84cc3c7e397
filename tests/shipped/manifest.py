"""Reads tests/shipped/cases.toml for scripts/setup-shipped.sh and scripts/shipped.sh.

  python3 tests/shipped/manifest.py envs [CASE...]   one line per environment the cases need:
                                                      NAME<TAB>KIND<TAB>BASE_VENV<TAB>REQS
  python3 tests/shipped/manifest.py cases [CASE...]  the cases as JSON, each version's python named

KIND is `base` (a torch virtualenv another script makes: .venv by scripts/setup.sh,
.venv-torch25 by scripts/setup-torch25.sh; nothing to build), `torch` (a torch virtualenv of
its own, made from REQS, under SHIPPED_TORCH_ENVS) or `overlay` (a small virtualenv over a
base's site-packages, REQS being the case's pins, under SHIPPED_ENVS). REQS is
space-separated. Standard library only (Python 3.11+).
"""
import json
import os
import re
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Where the overlays setup-shipped.sh makes go (override: SHIPPED_ENVS): in the checkout, as
# they stand on its .venv.
ENVS_DIR = os.environ.get("SHIPPED_ENVS", os.path.join(ROOT, ".venv-shipped"))
# Where its torch environments go (override: SHIPPED_TORCH_ENVS): outside the checkout, shared
# by every clone on the machine (CI's fresh clones too), as they depend on nothing in it and
# are the slow part (torch 2.8.0 from PyPI: 6.5 GB, 3 to 8 minutes here).
TORCH_ENVS_DIR = os.environ.get(
    "SHIPPED_TORCH_ENVS",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddp-verify-shipped"))
# SHIPPED_SKIP_TORCH_ENVS=1 leaves out the cases that need a torch environment of their own.
SKIP_TORCH_ENVS = os.environ.get("SHIPPED_SKIP_TORCH_ENVS") == "1"


def load():
    with open(os.path.join(HERE, "cases.toml"), "rb") as f:
        return tomllib.load(f)


def base_venv(name, spec):
    """The venv of a torch environment: DDP_VERIFY_VENV_<NAME> overrides the manifest's."""
    override = os.environ.get("DDP_VERIFY_VENV_" + re.sub(r"\W", "_", name).upper())
    if override:
        return os.path.abspath(override)
    if spec.get("requirements"):
        return os.path.join(TORCH_ENVS_DIR, name)
    return os.path.join(ROOT, spec["venv"])


def overlay_name(env, pins):
    slug = "+".join(p.replace("==", "-") for p in pins)
    return f"{env}--{re.sub(r'[^A-Za-z0-9.+_-]', '_', slug)}"


def env_of(manifest, side):
    """(name, kind, base venv, requirements) of one side of a case."""
    envs = manifest["envs"]
    env, pins = side["env"], list(side.get("pins", []))
    if env not in envs:
        sys.exit(f"manifest: no [envs.{env}] in cases.toml")
    base = base_venv(env, envs[env])
    if not pins:
        kind = "torch" if envs[env].get("requirements") else "base"
        return env, kind, base, list(envs[env].get("requirements", []))
    return overlay_name(env, pins), "overlay", base, pins


def python_of(name, kind, base):
    venv = base if kind in ("base", "torch") else os.path.join(ENVS_DIR, name)
    return os.path.join(venv, "bin", "python")


def needs_torch_env(manifest, case):
    return any(manifest["envs"][case[side]["env"]].get("requirements") for side in ("buggy", "fixed"))


def selected(manifest, names):
    cases = manifest["case"]
    if names:
        known = {c["name"] for c in cases}
        unknown = [n for n in names if n not in known]
        if unknown:
            sys.exit(f"manifest: no case named {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        cases = [c for c in cases if c["name"] in names]
    if SKIP_TORCH_ENVS:
        skipped = [c["name"] for c in cases if needs_torch_env(manifest, c)]
        if skipped:
            print(f"manifest: SHIPPED_SKIP_TORCH_ENVS=1 leaves out {', '.join(skipped)}", file=sys.stderr)
        cases = [c for c in cases if not needs_torch_env(manifest, c)]
    return cases


def main():
    what, names = sys.argv[1], sys.argv[2:]
    manifest = load()
    cases = selected(manifest, names)
    if what == "envs":
        seen = {}
        # Torch environments of their own first: overlays may stand on them.
        for case in cases:
            for side in ("buggy", "fixed"):
                name, kind, base, reqs = env_of(manifest, case[side])
                if kind == "overlay":
                    env = case[side]["env"]
                    spec = manifest["envs"][env]
                    if spec.get("requirements"):
                        seen.setdefault(env, (env, "torch", base, list(spec["requirements"])))
                seen.setdefault(name, (name, kind, base, reqs))
        order = sorted(seen.values(), key=lambda e: {"base": 0, "torch": 1, "overlay": 2}[e[1]])
        for name, kind, base, reqs in order:
            print("\t".join([name, kind, base, " ".join(reqs)]))
    elif what == "cases":
        out = []
        for case in cases:
            entry = dict(case)
            for side in ("buggy", "fixed"):
                name, kind, base, _ = env_of(manifest, case[side])
                entry[side] = dict(case[side], python=python_of(name, kind, base), env_name=name)
            entry["script"] = os.path.join(HERE, case["script"])
            out.append(entry)
        json.dump(out, sys.stdout, indent=1)
    else:
        sys.exit(f"manifest: unknown command {what!r} (envs or cases)")


if __name__ == "__main__":
    main()
