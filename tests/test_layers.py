"""The code's shape, read from its source with ``ast``: no import cycle, and
each concern in its one home (docs/architecture.md, "Who owns what").

These read the modules, never run them, so they fail the moment a change
adds a cycle or a second home, whatever the tests that run code cover.
"""

import ast
import subprocess
import sys
from pathlib import Path

import mvc

ROOT = Path(mvc.__file__).parent

# Cycles through an import inside a function that a change under way removes; each names why it is here.
KNOWN_CYCLES = set()


def modules() -> dict:
    """Dotted name -> parsed module, for every module of the mvc package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (path, ast.parse(path.read_text(), str(path)))
    return out


def _targets(name: str, is_package: bool, node, known) -> set:
    """The mvc modules one import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    else:
        base = name.split(".") if is_package else name.split(".")[:-1]
        if node.level:
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        found = {f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names}
    out = set()
    for target in found:
        while target not in known and "." in target:  # `from .store.fs import x`: the module mvc.store.fs
            target = target.rsplit(".", 1)[0]
        if target in known and target != name:
            out.add(target)
    return out


def import_graph(top_level_only: bool = False) -> dict:
    """Module -> the mvc modules it imports (at module level, or anywhere in it)."""
    known = modules()
    graph = {}
    for name, (path, tree) in known.items():
        nodes = tree.body if top_level_only else ast.walk(tree)
        graph[name] = set().union(*(_targets(name, path.name == "__init__.py", n, known) for n in nodes
                                    if isinstance(n, (ast.Import, ast.ImportFrom))))
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_level_import_cycle():
    assert cycles(import_graph(top_level_only=True)) == []


def test_no_import_cycle_even_through_imports_inside_functions():
    found = [c for c in cycles(import_graph()) if frozenset(c) not in KNOWN_CYCLES]
    assert found == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "mvc.remote.backend" in graph["mvc.remote.s3"] and "mvc.remote.s3" in graph["mvc.remote.bucket"]
    graph["mvc.remote.backend"].add("mvc.remote.s3")  # what bucket <-> s3 was
    assert ["mvc.remote.backend", "mvc.remote.s3"] in cycles(graph)


def _first_parent_loops(tree) -> list:
    """Line numbers of ``while`` loops that step to ``something.parents[0]``."""
    found = []
    for loop in ast.walk(tree):
        if isinstance(loop, ast.While) and any(
                isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "parents"
                and isinstance(n.slice, ast.Constant) and n.slice.value == 0 for n in ast.walk(loop)):
            found.append(loop.lineno)
    return found


def test_one_first_parent_iterator():
    """Walks along first parents go through reach.first_parents (refs' ~N, gc, the web's log)."""
    loops = {name: lines for name, (_, tree) in modules().items() if name != "mvc.reach"
             for lines in [_first_parent_loops(tree)] if lines}
    assert loops == {}
    assert _first_parent_loops(ast.parse("while c:\n    c = obj.parents[0]\n")) == [1]


GROWERS = {"extend", "append", "appendleft", "add", "update", "heappush", "put"}


def _parent_worklists(tree) -> list:
    """Line numbers of ``while`` loops that grow a worklist with something naming ``.parents``:
    ``todo += obj.parents``, ``stack.extend(...parents...)`` (a graph walk of its own)."""
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.While):
            continue
        grown = [n.value for n in ast.walk(loop) if isinstance(n, ast.AugAssign)]
        grown += [arg for n in ast.walk(loop) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in GROWERS for arg in n.args]
        if any(isinstance(n, ast.Attribute) and n.attr == "parents" for g in grown for n in ast.walk(g)):
            found.append(loop.lineno)
    return found


def test_one_closure_walk():
    """Walks over commit parents go through reach (ancestors, ancestry, closure, walk, parents_first):
    push, fetch, the remote checks, the cache's unpushed commits, audit, history, repack."""
    loops = {name: lines for name, (_, tree) in modules().items() if name != "mvc.reach"
             for lines in [_parent_worklists(tree)] if lines}
    assert loops == {}
    assert _parent_worklists(ast.parse("while todo:\n    todo += repo.objects.commit(txn, todo.pop()).parents\n")) == [1]
    assert _parent_worklists(ast.parse("while s:\n    s.extend(p for p in live.parents.get(s.pop(), ()))\n")) == [1]
    assert _parent_worklists(ast.parse("while q:\n    q.append(q.pop().tree)\n")) == []


LISTING = {"entries", "listdir", "scandir", "walk", "glob", "rglob", "iterdir", "scan_packs", "disk_usage"}
# Modules that still list the packs folder themselves, each until the change named.
KNOWN_PACK_LISTERS = set()


def _lists_packs(tree) -> list:
    """Line numbers of calls that list a folder named by the constant "packs"."""
    found = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in LISTING and any(isinstance(n, ast.Constant) and n.value == "packs"
                                   for arg in call.args for n in ast.walk(arg)):
            found.append(call.lineno)
    return found


def test_only_the_store_lists_its_packs_folder():
    """gc, repack, eviction, usage and the scan ask the chunk store (ChunkStore.pack_files)."""
    listers = {name: lines for name, (_, tree) in modules().items()
               if not name.startswith("mvc.store") and name not in KNOWN_PACK_LISTERS
               for lines in [_lists_packs(tree)] if lines}
    assert listers == {}
    assert _lists_packs(ast.parse('entries(repo.dir / "packs")')) == [1]


LAYOUT = {"mvc.store.packs", "mvc.store.packformat"}  # the pack layout: records, trailers, file names
SEAM_TYPES = {"Location"}  # what ChunkStore.locate returns: a value above the seam may hold
# Modules outside mvc/store that read pack bytes themselves, each with why: the remote layer
# writes and reads packs in a bucket, not on a disk the chunk store owns.
KNOWN_LAYOUT_READERS = {"mvc.remote"}


def _layout_imports(name: str, is_package: bool, tree, known) -> list:
    """(line, what) of the imports of module ``name`` that reach the pack layout past the seam:
    the modules themselves, or any name of theirs but a seam type."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in LAYOUT]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                one = ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                for target in _targets(name, is_package, one, known) & LAYOUT:
                    if target.endswith("." + alias.name) or alias.name not in SEAM_TYPES:
                        found.append((node.lineno, f"{target}.{alias.name}"))
    return found


def test_only_the_store_reads_the_pack_layout():
    """fsck, gc and the scheduled scan ask the chunk store about its packs (pack_records,
    pack_locations, check_packs, salvage): none imports RECORD_HEAD, read_locations,
    pack_filename … from store/packs.py, so one checker and one reader of the layout stay."""
    known = modules()
    readers = {name: found for name, (path, tree) in known.items()
               if not name.startswith("mvc.store") and not name.startswith(tuple(KNOWN_LAYOUT_READERS))
               for found in [_layout_imports(name, path.name == "__init__.py", tree, known)] if found}
    assert readers == {}
    for source in ("from .store.packs import RECORD_HEAD, pack_filename", "from .store import packs",
                   "import mvc.store.packs", "from .store.packformat import HEADER"):
        assert _layout_imports("mvc.fsck", False, ast.parse(source), known), source
    assert _layout_imports("mvc.sliced", False, ast.parse("from .store.packs import Location"), known) == []
    assert _layout_imports("mvc.gc", False, ast.parse("from .store.chunks import RECORD_OVERHEAD"), known) == []


def test_the_repository_reaches_its_layers_through_ordinary_imports():
    source = (ROOT / "repository.py").read_text()
    assert "importlib" not in source and "_remote(" not in source and "_state_module" not in source


def test_import_mvc_does_not_import_torch():
    """Why commits, reader and repository import state, live and merge inside functions."""
    code = "import sys, mvc; r = mvc.Repository; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _docstrings(tree) -> set:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _names_commands(tree, commands) -> list:
    """Line numbers of strings (not docstrings) that tell the user to run ``mvc COMMAND``."""
    import re
    said = re.compile(r"['(`]mvc (%s)\b" % "|".join(sorted(commands)))
    docs = _docstrings(tree)
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and said.search(n.value)]


def test_the_library_names_no_command():
    """Library messages say what went wrong (error classes with attributes); mvc/cli adds the
    command to run (cli/base.py HINTS). The web pages are a client of their own, as the CLI is."""
    from mvc.cli import main
    commands = set(main.commands)
    named = {name: lines for name, (_, tree) in modules().items()
             if not name.startswith(("mvc.cli", "mvc.web"))
             for lines in [_names_commands(tree, commands)] if lines}
    assert named == {}
    assert _names_commands(ast.parse("raise X(\"no remote; run 'mvc remote add'\")"), commands) == [1]


def _names_flags(tree) -> list:
    """Line numbers of strings (not docstrings) that name a command-line flag (``--force``)."""
    import re
    flag = re.compile(r"(^|[\s('\"`])--[a-z][a-z-]*")
    docs = _docstrings(tree)
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and flag.search(n.value)]


def test_the_library_names_no_flag():
    """A library message that said "pass --force" told a Python caller about a flag it does not
    have: the library says what ``force=True`` would do (``MvcError.forced``), the CLI says --force."""
    named = {name: lines for name, (_, tree) in modules().items()
             if not name.startswith(("mvc.cli", "mvc.web"))
             for lines in [_names_flags(tree)] if lines}
    assert named == {}
    assert _names_flags(ast.parse("raise X(f'{p} exists; pass --force to overwrite it')")) == [1]


def test_every_error_class_lives_in_errors():
    """Classes that extend an exception are defined in mvc/errors.py (a private one that never
    leaves its module, like sharded._Clash, aside)."""
    import mvc.errors
    known = {name for name, value in vars(mvc.errors).items() if isinstance(value, type)} | {"Exception"}
    outside = {f"{name}.{node.name}" for name, (_, tree) in modules().items() if name != "mvc.errors"
               for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
               and any((getattr(b, "id", None) or getattr(b, "attr", None)) in known
                       or (getattr(b, "id", None) or getattr(b, "attr", "")).endswith("Error") for b in node.bases)}
    assert outside == set()


def test_a_repository_and_its_verb_groups_form_no_reference_cycle(tmp_path):
    """Dropped without close, a repository is freed at once (refcount), not at the next cyclic gc."""
    import gc
    import weakref
    repo = mvc.Repository.init(tmp_path)
    groups = [repo.remotes, repo.cache, repo.shards, repo.bisect, repo.trust, repo.locks, repo.reflog]
    assert all(g.repo is repo for g in groups)
    gone = weakref.ref(repo)
    del repo, groups
    gc.disable()
    try:
        assert gone() is None
    finally:
        gc.enable()
