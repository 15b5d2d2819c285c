"""moai/ never imports prefect (docs/DESIGN.md: imports point one way)."""

import ast
import subprocess

import pytest

from conftest import PYTHON, ROOT, subprocess_env


def test_no_module_under_moai_imports_prefect():
    offenders = []
    for path in (ROOT / "moai").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "prefect" or n.startswith("prefect.") for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


@pytest.mark.slow
def test_importing_every_moai_module_loads_no_prefect():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "moai").rglob("*.py")
    )
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))"
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(), check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _module_name(path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _top_level_moai_imports(path) -> set[str]:
    """moai modules imported at module scope (imports inside functions are deferred on purpose)."""
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("moai")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moai"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_module_imports_form_no_circle():
    modules = {_module_name(p): p for p in (ROOT / "moai").rglob("*.py")}
    graph = {m: {i for i in _top_level_moai_imports(p) if i in modules and i != m} for m, p in modules.items()}
    # a package's __init__ importing its own submodules is how packages re-export; not a circle
    graph = {
        m: {i for i in deps if not (i.startswith(m + ".") and modules[m].name == "__init__.py")}
        for m, deps in graph.items()
    }
    seen: dict[str, int] = {}

    def visit(m, path):
        if seen.get(m) == 1:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(m) :], m]))
        if seen.get(m) == 2:
            return
        seen[m] = 1
        for d in sorted(graph[m]):
            visit(d, [*path, m])
        seen[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_config_is_a_leaf():
    for path in (ROOT / "moai" / "config").glob("*.py"):
        outside = {i for i in _top_level_moai_imports(path) if not i.startswith("moai.config")}
        assert outside <= {"moai.errors", "moai.errors.ConfigError"}, path


def test_only_hardware_asks_the_machine():
    """psutil and os.cpu_count are read in moai/hardware.py alone (the training process, which runs
    on the device it asks about, is the one other place that asks torch.cuda)."""
    offenders = []
    for path in list((ROOT / "moai").rglob("*.py")) + list((ROOT / "flows").rglob("*.py")):
        if path.name == "hardware.py":
            continue
        text = path.read_text()
        for needle in ("cpu_count(", "import psutil", "virtual_memory(", "disk_usage("):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


def test_every_user_facing_error_is_a_moai_error():
    from moai import errors
    from moai.launch import TrainingFailed

    for cls in (errors.ConfigError, errors.DataError, errors.TokenizerError, errors.CacheError, TrainingFailed):
        assert issubclass(cls, errors.MoaiError)
    from moai.config import ConfigError

    assert ConfigError is errors.ConfigError
