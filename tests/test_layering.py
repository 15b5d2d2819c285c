"""moai/ never imports prefect (DESIGN.md: imports point one way)."""

import ast
import subprocess

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


def test_importing_every_moai_module_loads_no_prefect():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "moai").rglob("*.py")
    )
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))"
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(), check=True)
    assert out.stdout.strip() == "[]", out.stdout
