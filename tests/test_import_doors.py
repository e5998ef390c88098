"""The doors between the rooms stay where the README says they are.

 * The scheduler (hetswarm.coordinator, every module of coordinator/scheduling/, and the wire formats it prices)
   imports without hivemind, torch or pydantic, so a researcher can plan on a laptop: checked by importing it in a
   fresh interpreter; `hetswarm schedule` runs without hivemind, torch or the records' pydantic.v1, checked by
   running it in one; the CLI and the training runtime load transformers only for a Hugging Face model; a stage's
   compute imports without hivemind or pydantic.
 * protocol imports neither client nor coordinator; coordinator does not import client; nothing outside
   client/cli imports the CLI; client/peer reaches, of hetswarm, only protocol and itself, client/training only
   protocol, client.peer and itself: checked statically, from every import statement in the source files (also
   those inside functions).
 * Private hivemind names appear in client/peer/hivemind_compat/ only: checked statically against the names
   hivemind's own source defines.
"""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"protocol": "hetswarm.protocol", "coordinator": "hetswarm.coordinator", "client": "hetswarm.client"}

SCHEDULER_MODULES = [
    "hetswarm.coordinator", "hetswarm.protocol.network", "hetswarm.protocol.model_config",
    "hetswarm.protocol.wire_format",
    *(f"hetswarm.coordinator.scheduling.{path.stem}" for path in sorted((ROOT / "coordinator" / "scheduling").glob("*.py"))
      if path.stem != "__init__"),
]
"""The scheduler: the coordinator package itself, every module of coordinator/scheduling/, and what they price."""
HEAVY_PACKAGES = ["hivemind", "torch", "pydantic"]

# Runs in a fresh interpreter: imports the modules, then runs the `hetswarm` command line if one is given (its
# stdout kept), and for each heavy package that got loaded anyway names the hetswarm lines that pulled it in
# (recorded by a finder that sees the first import of that package).
_PROBE = """
import contextlib, importlib, io, json, sys, traceback
heavy, modules, command, root = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
culprits = {}

class Recorder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname in heavy and fullname not in culprits:
            culprits[fullname] = [f"{f.filename}:{f.lineno}: {f.line}" for f in traceback.extract_stack()
                                  if f.filename.startswith(root)]
        return None

sys.meta_path.insert(0, Recorder())
for name in modules:
    importlib.import_module(name)
output = io.StringIO()
if command:
    sys.argv = ["hetswarm", *command]
    from hetswarm.client.cli import main
    with contextlib.redirect_stdout(output):
        try:
            main()
        except SystemExit as e:
            if e.code:
                raise
loaded = {name: culprits.get(name, []) for name in heavy if name in sys.modules}
print(json.dumps({"loaded": loaded, "output": output.getvalue()}))
"""


def _probe(heavy: list[str], modules: list[str], command: list[str] = ()) -> str:
    """What `_PROBE` prints of `command`, after asserting that none of `heavy` was imported."""
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(heavy), json.dumps(modules),
                             json.dumps(list(command)), str(ROOT)],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    probed = json.loads(result.stdout.strip().splitlines()[-1])
    report = "\n".join(f"{name} imported via:\n  " + "\n  ".join(chain or ["(no hetswarm frame)"])
                       for name, chain in probed["loaded"].items())
    assert not probed["loaded"], f"pulled in {sorted(probed['loaded'])}:\n{report}"
    return probed["output"]


@pytest.mark.swarm
def test_scheduler_imports_without_hivemind_torch_or_pydantic():
    _probe(HEAVY_PACKAGES, SCHEDULER_MODULES)


@pytest.mark.swarm
def test_hetswarm_schedule_runs_without_hivemind_torch_or_the_record_schemas():
    """`hetswarm schedule` starts without them: a researcher plans on a laptop, and the command answers at once. It
    prices a compression policy per link without the records' pydantic.v1 schemas (typer itself loads pydantic 2 to
    parse the options, so the check names the v1 API hetswarm's records use)."""
    output = _probe(["hivemind", "torch", "pydantic.v1"], [],
                    ["schedule", "--scenario", "mixed-regional", "--model", "small", "--compression", "auto",
                     "--time-budget", "0.2", "--json", "--no-baselines"])
    planned = json.loads(output)
    assert planned["d_dp"] * planned["d_pp"] == 64 and planned["cost"] > 0, planned
    assert planned["wire"]["policy"] == "auto" and planned["wire"]["predicted_step_s"] > 0, planned


@pytest.mark.swarm
def test_a_stages_compute_imports_without_hivemind_or_pydantic():
    """A GPU machine with torch and transformers alone runs a stage as the swarm does (benchmarks/gpu_stage.py)."""
    _probe(["hivemind", "pydantic"], ["hetswarm.client.training.model", "hetswarm.client.training.llama",
                                      "hetswarm.client.training.pipeline_schedule", "hetswarm.client.training.reference",
                                      "hetswarm.client.training.activation_memory"])


@pytest.mark.swarm
def test_the_cli_and_the_training_runtime_import_without_transformers():
    """Only Hugging Face models and `hetswarm export` need transformers (seconds to import): a GPT-2 swarm does not."""
    _probe(["transformers", "safetensors"], ["hetswarm.client.cli.app", "hetswarm.client.training.trainer",
                                             "hetswarm.client.training.model"])


# --- static checks -----------------------------------------------------------------------------------------------

def module_name(path: Path, root: Path = ROOT) -> str:
    """client/training/trainer.py -> hetswarm.client.training.trainer (the package-dir map of pyproject.toml)."""
    relative = path.relative_to(root)
    parts = [PACKAGE_DIRS[relative.parts[0]], *relative.parts[1:-1]]
    if path.stem != "__init__":
        parts.append(path.stem)
    return ".".join(parts)


def source_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imported_names(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, fully qualified name) of everything the file imports: `from a.b import c` gives a.b.c (c may be a
    module); relative imports are resolved against the file's package."""
    module = module_name(path, root)
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names += [(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}") for alias in node.names]
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(files: list[Path], is_allowed) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: imports {name}"
            for path in files for line, name in imported_names(path) if not is_allowed(name)]


def test_imported_names_resolve_from_and_relative_imports(tmp_path):
    """The checker itself: a violation written any way Python allows is seen."""
    folder = tmp_path / "coordinator"
    folder.mkdir()
    (folder / "bad.py").write_text("import hetswarm.client.peer\nfrom hetswarm import client\n"
                                   "from ..client.cli import app\ndef f():\n    from hetswarm.client.cli import main\n")
    assert [name for _, name in imported_names(folder / "bad.py", root=tmp_path)] == [
        "hetswarm.client.peer", "hetswarm.client", "hetswarm.client.cli.app", "hetswarm.client.cli.main"]


def test_protocol_imports_neither_client_nor_coordinator():
    found = violations(source_files("protocol"), lambda name: not (within(name, "hetswarm.client")
                                                                  or within(name, "hetswarm.coordinator")))
    assert not found, "\n".join(found)


def test_coordinator_does_not_import_client():
    found = violations(source_files("coordinator"), lambda name: not within(name, "hetswarm.client"))
    assert not found, "\n".join(found)


def test_nothing_outside_the_cli_imports_it():
    files = [path for folder in PACKAGE_DIRS for path in source_files(folder)
             if not path.is_relative_to(ROOT / "client" / "cli")]
    found = violations(files, lambda name: not within(name, "hetswarm.client.cli"))
    assert not found, "\n".join(found)


def test_peer_reaches_only_protocol_and_itself():
    """What every peer runs does not depend on the coordinator's planning, the monitor or the training runtime."""
    allowed = ("hetswarm.protocol", "hetswarm.client.peer")
    found = violations(source_files("client/peer"),
                       lambda name: not within(name, "hetswarm") or any(within(name, p) for p in allowed))
    assert not found, "\n".join(found)


def test_training_reaches_only_protocol_peer_and_itself():
    allowed = ("hetswarm.protocol", "hetswarm.client.peer", "hetswarm.client.training")
    found = violations(source_files("client/training"),
                       lambda name: not within(name, "hetswarm") or any(within(name, p) for p in allowed))
    assert not found, "\n".join(found)


# --- hivemind's internals stay in one room ----------------------------------------------------------------------

HIVEMIND_ROOM = ROOT / "client" / "peer" / "hivemind_compat"
_PRIVATE_MODULE_PARTS = ("p2p_daemon_bindings",)
"""hivemind modules that its packages do not export: the daemon client's (hivemind.p2p exports P2P and its errors)."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(tree: ast.AST, *, own_attributes_only: bool = False) -> set[str]:
    """Every name a piece of source defines: functions, classes, attributes it assigns (with `own_attributes_only`,
    those of `self` or `cls` only: `key._private_key = ...` defines nothing of ours), module and local names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if not own_attributes_only or _root_name(node) in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


@functools.cache
def hivemind_private_names() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The private names hivemind's source defines (`_get_peer_stub`, `_client`, ...), and those of each of its
    classes by class name, its hivemind bases' included."""
    import hivemind
    names, own, bases = set(), {}, {}
    for path in Path(hivemind.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names |= _defined_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                own.setdefault(node.name, set()).update(filter(_is_private, _defined_names(node)))
                bases.setdefault(node.name, set()).update(map(_base_name, node.bases))

    def of_class(name: str, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        inherited = [of_class(base, seen | {name}) for base in bases.get(name, ()) if base not in seen | {name}]
        return frozenset(own.get(name, set())).union(*inherited)

    return frozenset(filter(_is_private, names)), {name: of_class(name) for name in own}


def _hivemind_bound(tree: ast.AST) -> set[str]:
    """The local names a file binds to hivemind modules and objects (`import hivemind`, `from hivemind.p2p import P2P`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {alias.asname or alias.name.partition(".")[0] for alias in node.names
                      if within(alias.name, "hivemind")}
        elif isinstance(node, ast.ImportFrom) and node.module and within(node.module, "hivemind"):
            bound |= {alias.asname or alias.name for alias in node.names}
    return bound


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_hivemind_uses(path: Path, ours: frozenset[str]) -> list[str]:
    """Where a file reaches past hivemind's public API: an import of a private hivemind module or name; an attribute
    named as one of hivemind's private names (`p2p._client`), unless hetswarm defines that name itself (a name both
    define cannot be told apart statically); a private name of a hivemind class defined in a subclass (an override);
    an attribute of a hivemind class or module replaced (`P2P.receive_raw_data = ...`)."""
    private, of_class = hivemind_private_names()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound, found = _hivemind_bound(tree), []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and within(node.module, "hivemind"):
            found += [f"{where}: imports {node.module}.{alias.name}" for alias in node.names
                      if any(_is_private(part) or part in _PRIVATE_MODULE_PARTS
                             for part in f"{node.module}.{alias.name}".split("."))]
        elif isinstance(node, ast.Import):
            found += [f"{where}: imports {alias.name}" for alias in node.names if within(alias.name, "hivemind")
                      and any(_is_private(p) or p in _PRIVATE_MODULE_PARTS for p in alias.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr in private and node.attr not in ours:
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.ClassDef):
            hidden = frozenset().union(*(of_class.get(_base_name(b), frozenset()) for b in node.bases
                                         if _root_name(b) in bound))
            found += [f"{where}: {node.name} overrides hivemind's {name}"
                      for name in sorted(_defined_names(node) & hidden)]
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{where}: replaces {ast.unparse(t)}" for t in targets
                      if isinstance(t, ast.Attribute) and _root_name(t) in bound]
    return found


def _our_names(files: list[Path]) -> frozenset[str]:
    return frozenset(name for path in files
                     for name in _defined_names(ast.parse(path.read_text(encoding="utf-8")), own_attributes_only=True))


def test_the_private_hivemind_checker_sees_each_way_in(tmp_path):
    """The checker itself: each way of reaching past hivemind's public API is seen, and neither hetswarm's own
    names nor a private name of a hivemind class that is not a base are taken for an override."""
    bad = tmp_path / "bad.py"
    bad.write_text("from hivemind.averaging.allreduce import AllReduceRunner\nfrom hivemind.p2p import P2P, ServicerBase\n"
                   "from hivemind.p2p.p2p_daemon_bindings.control import ControlClient\n"
                   "class Runner(AllReduceRunner):\n    async def _ban_sender(self, peer): ...\n"
                   "class Servicer(ServicerBase):\n    def _ban_sender(self): ...\n"
                   "async def dial(p2p, peer):\n    await p2p._client.connect(peer, [])\n"
                   "P2P.receive_raw_data = staticmethod(len)\nstate = object()._state\n"
                   "def wrap(key):\n    key._private_key = None\n")
    found = private_hivemind_uses(bad, _our_names([bad]) | {"_state", "_ban_sender"})
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "." + "_client", "." + "_private_key", "Runner overrides hivemind's _ban_sender",
        "imports hivemind.p2p.p2p_daemon_bindings.control.ControlClient", "replaces P2P.receive_raw_data"], found


def test_private_hivemind_names_appear_in_the_compat_room_only():
    """hivemind_compat/ is the one place a new hivemind release can break silently (docs/hivemind.md)."""
    files = [path for folder in PACKAGE_DIRS for path in source_files(folder) if not path.is_relative_to(HIVEMIND_ROOM)]
    ours = _our_names(files)
    found = [use for path in files for use in private_hivemind_uses(path, ours)]
    assert not found, "reach hivemind's internals through client/peer/hivemind_compat/:\n" + "\n".join(found)
