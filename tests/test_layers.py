"""The package's layers, read from every module's imports with ``ast`` (deferred imports inside functions
included; imports under ``if TYPE_CHECKING:`` left out, since they run never): a module may import its own layer
and the layers below it, never one above, and no set of modules may import each other in a cycle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top; a module belongs to the first layer with a prefix of its name.
LAYERS = [
    ("base", ["vime_ext", "vime_ext.flags", "vime_ext.quiet", "vime_ext.sysinfo", "vime_ext.tracking", "vime_ext.net",
              "vime_ext.data", "vime_ext.models"]),
    ("engines", ["vime_ext.engines"]),  # servers, protocol, client, weight transport
    ("agent", ["vime_ext.agent"]),  # what plug-ins import: Sample, Trajectory, tool calls, reward helpers
    ("algorithms", ["vime_ext.algorithms"]),
    ("rollout", ["vime_ext.rollout"]),  # rollout orchestration, plug-in loading, validation, data sources
    ("config", ["vime_ext.arguments", "vime_ext.gpu_sharing"]),  # the run's flags, checked; how GPUs are shared
    ("convert", ["vime_ext.convert"]),  # HF <-> Megatron names, one file per family
    ("trainer", ["vime_ext.trainer"]),
    ("driver", ["vime_ext.driver", "vime_ext.evaluate"]),  # the loop and the processes it starts; evaluation
    ("entry points", ["vime_ext.train", "vime_ext.demo"]),
]


def module_names() -> dict[str, Path]:
    """Every module of the package by its import name. ``vime_ext/convert`` links to the top-level ``convert/``
    folder (the mapping's home in the design), which pathlib's glob does not enter: its files are read there."""
    found = {}
    for path in sorted([*ROOT.glob("vime_ext/**/*.py"), *ROOT.glob("convert/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] == "convert":
            parts = ("vime_ext", *parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer_of(module: str) -> int:
    best = max(((i, p) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), key=lambda ip: len(ip[1]), default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts a.b.c when that is a module)."""
    found = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, deps in edges.items() for b in sorted(deps)
            if layer_of(b) > layer_of(a) and not a.startswith(b + ".")]  # a package's __init__ may be below it


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import each other in a cycle (Tarjan's strongly connected components)."""
    # A package's modules import the package itself (its __init__); that is not a cycle through it.
    edges = {a: {b for b in deps if not a.startswith(b + ".")} for a, deps in edges.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def strongly_connected(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strongly_connected(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongly_connected(v)
    return cycles


def test_every_import_goes_down_the_layers():
    upward = upward_imports(graph())
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_no_import_cycles():
    cycles = import_cycles(graph())
    assert not cycles, f"modules that import each other in a cycle: {cycles}"


def test_the_checks_catch_an_upward_import_and_a_cycle():
    """The two checks on the real graph with one import added that the layers forbid: the engines' client
    importing the trainer's actor goes up three layers; the actor then imports the client and the client the
    actor, a cycle."""
    edges = graph()
    assert "vime_ext.engines.client" in edges and "vime_ext.trainer.actor" in edges
    edges["vime_ext.engines.client"] = edges["vime_ext.engines.client"] | {"vime_ext.trainer.actor"}
    assert upward_imports(edges) == ["vime_ext.engines.client (engines) imports vime_ext.trainer.actor (trainer)"]
    edges["vime_ext.trainer.actor"] = edges["vime_ext.trainer.actor"] | {"vime_ext.engines.client"}
    assert ["vime_ext.engines.client", "vime_ext.trainer.actor"] in import_cycles(edges)


def test_the_layers_name_every_module():
    for module in module_names():
        layer_of(module)


def test_nothing_imports_the_mapping_by_its_folder_name():
    """The mapping installs as ``vime_ext.convert`` (no top-level ``convert`` package): an import of ``convert``
    works in the source tree only, and would fail after ``pip install``."""
    found = []
    for folder in ("vime_ext", "convert", "tools", "tests", "examples"):
        for path in sorted((ROOT / folder).glob("**/*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                          if n == "convert" or (n or "").startswith("convert.")]
    assert not found, "imports of the top-level convert folder (use vime_ext.convert): " + ", ".join(found)
