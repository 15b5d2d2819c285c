"""The README and the guides in docs/ link to files that exist, and the README stays short."""

import re

from conftest import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_in_the_readme_and_guides_names_a_file_that_exists():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if "//" in target or target.startswith(("data:", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_is_short_and_links_every_guide():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    guides = {p.name for p in (ROOT / "docs").glob("*.md")} - {"DESIGN.md", "STYLE.md", "FIELD-NOTES.md"}
    assert guides and all(f"docs/{name}" in readme for name in guides), guides


def test_ci_runs_exactly_the_readmes_full_suite_command_and_the_readme_gives_the_fast_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    fast = [b for b in blocks if "pytest" in b and "setup.sh dev" in b]
    assert fast and '-m "not slow"' in fast[0]
    full = [b.strip() for b in blocks if b.strip().startswith(".venv/bin/python -m pytest")]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert full == [ci[-1]]
    assert "bash .ci/system-deps.sh" in ci  # what the system tests need, installed by CI, not by a test
