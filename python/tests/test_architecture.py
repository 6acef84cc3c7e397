"""The recorder in layers, one way down: the Python twin of tests/it/architecture.rs.

The import graph is read from the source (ast), imports inside functions included: one of
those runs the first time its function does, and a cycle closed by one is a cycle all the
same. `if TYPE_CHECKING:` blocks are left out: they never run (the package annotates with
`from __future__ import annotations`), so they cannot make an import order, and a type
named there binds nothing at run time.

The rule: `LAYERS` lists every module of the package, lowest layer first, and each layer's
modules lowest first. A module may import any module of a lower layer, and the modules
listed before it in its own layer; never itself, a later one, or a higher layer. An import
of `a.b.c` also runs `a.b`'s `__init__` (a package imports before its modules), so it counts
as an import of that package too, unless the importer is inside it already; the root
package's `__init__` alone is left out there, as Python runs it before any of its modules.
With one order over all modules no cycle can pass; cycles are also looked for on their own,
to name them when the order is wrong."""
import ast
import pathlib

import ddp_verify_trace

PACKAGE = pathlib.Path(ddp_verify_trace.__file__).parent
ROOT = "ddp_verify_trace"

# Lowest first: (layer, its modules lowest first). A module is named by its path in the
# package ("_stages.batches" is _stages/batches.py, "engines" is engines/__init__.py), and
# the package's own __init__.py, the public face, is "__init__".
LAYERS = [
    # Leaves: the generated schema, and what needs nothing of the recorder but the schema.
    ("leaves", ["_schema", "_args", "_tensors", "_collectives", "_positions", "_magnitudes", "_stream",
                "_progress", "_deal", "_detect", "_perturb", "_groups", "_extras"]),  # fmt: skip
    # `watch --stop-on-fault`: each step's small trace, written with the trace's own writer.
    ("step file", ["_step_file"]),
    # Every patch goes through one registry, and `Patches`.
    ("patching", ["_patches"]),
    # What changes the run where ddp-verify asks: every dropout the identity, CUDA run on the CPU,
    # the precision control's backwards at DDP's loss divisor.
    ("run changes", ["_no_dropout", "_cpu_device", "_divisor"]),
    # Whose code made a call: one walk over frames, by the prefixes frameworks register.
    ("owners", ["_owners"]),
    # Stage facts: pure functions, and the per-rank state a watch holds.
    ("stage facts", ["_stages", "_stages.fingerprint", "_stages.loss", "_stages.batches", "_stages.local_sums",
                     "_stages.exchange"]),  # fmt: skip
    # What a recording has seen; the data sampler that tells the open recordings its epochs.
    ("watch", ["_watch", "accumulation_sampler"]),
    ("engines", ["engines.base", "engines.ddp", "engines.fsdp2", "engines.deepspeed", "engines"]),
    ("frameworks", ["frameworks.base", "frameworks.accelerate", "frameworks.colossalai", "frameworks.deepspeed",
                    "frameworks.lightning", "frameworks.transformers", "frameworks"]),  # fmt: skip
    ("torch's patches", ["_outermost", "_torch_patches"]),
    ("recorder", ["_followed", "recorder"]),
    ("session", ["session", "callbacks"]),
    # The public face, then the zero-edit start that calls it (loaded by sitecustomize).
    ("public", ["__init__", "auto", "autoload.sitecustomize"]),
]


def modules():
    """{module name: path} of every .py file in the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "__init__"] = path
    return out


def _absolute(name):
    return ROOT if name == "__init__" else f"{ROOT}.{name}"


def _relative(absolute):
    return "__init__" if absolute == ROOT else absolute[len(ROOT) + 1 :]


def _type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree):
    """Every import statement, at any depth, but for the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(name, path, known):
    """{module of the package that `name` imports: the first line that does}."""
    me = _absolute(name)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = {}
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import name`: the module pkg.name where there is one, else pkg itself.
            targets = [f"{base}.{a.name}" if _relative(f"{base}.{a.name}") in known else base for a in node.names]
        for target in targets:
            if target != ROOT and not target.startswith(ROOT + "."):
                continue
            found.setdefault(_relative(target), node.lineno)
            # The packages it is inside run first: those the importer is not inside already.
            parts = target.split(".")
            for i in range(2, len(parts)):
                enclosing = ".".join(parts[:i])
                if not (me == enclosing or me.startswith(enclosing + ".")):
                    found.setdefault(_relative(enclosing), node.lineno)
    found.pop(name, None)
    return found


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan's), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def order():
    """{module: (its layer's index, its index in the layer)}."""
    return {m: (i, j) for i, (_, layer) in enumerate(LAYERS) for j, m in enumerate(layer)}


def test_every_module_is_in_one_layer():
    listed = [m for _, layer in LAYERS for m in layer]
    assert len(listed) == len(set(listed)), "a module listed twice in LAYERS"
    known = set(modules())
    assert sorted(known - set(listed)) == [], "modules in no layer: add each to LAYERS where it belongs"
    assert sorted(set(listed) - known) == [], "LAYERS names modules the package does not have"


def test_the_import_graph_has_no_cycle():
    found = cycles(graph())
    assert found == [], "import cycles:\n" + "\n".join(", ".join(c) for c in found)


def test_every_import_goes_down():
    where = order()
    layer = {m: LAYERS[i][0] for m, (i, _) in where.items()}
    wrong = [
        f"{name} (line {line}, {layer[name]}) imports {target} ({layer[target]})"
        for name, targets in sorted(graph().items())
        for target, line in sorted(targets.items())
        if where[target] >= where[name]
    ]
    assert wrong == [], "imports against the layers, lowest first in LAYERS:\n" + "\n".join(wrong)


def test_the_graph_reader_sees_what_it_must():
    """Not vacuous: imports inside functions count, TYPE_CHECKING ones do not, a package's
    __init__ comes with its modules, and a cycle is found."""
    g = graph()
    assert "auto" in g["autoload.sitecustomize"]  # inside an if, absolute
    assert "__init__" in g["auto"]  # `import ddp_verify_trace` inside start()
    assert "engines.ddp" in g["frameworks.lightning"] and "engines" in g["frameworks.lightning"]  # inside a function
    assert "callbacks" in g["__init__"] and "_stages" in g["recorder"]
    assert "frameworks" not in g["_owners"]
    tree = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert cycles(tree) == [["a", "b", "c"]]


def test_no_file_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 600}
    assert long == {}
