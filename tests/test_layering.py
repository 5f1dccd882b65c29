"""No import runs back up the layers: optim/ < integration/ < training/, conversion/ (docs/layout.md). Each module's
imports of nanochat_hf, relative or absolute, at any depth (also those inside functions), read with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "nanochat_hf"
BASE = {"errors", "atomic", "jsonfile", "lazy", "paths", "progress"}  # leaf modules every layer may use
ALLOWED = {  # package -> the parts of nanochat_hf its modules may import
    "optim": BASE | {"optim"},
    "integration": BASE | {"optim", "integration"},
    "conversion": BASE | {"optim", "integration", "conversion", "model", "tokenizer"},
}


def imported_parts(path: Path) -> set[str]:
    """The first component under nanochat_hf of everything `path` imports from the package."""
    module = path.relative_to(PACKAGE).with_suffix("").parts  # e.g. ("optim", "routing")
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: up from the module's package
                base = list(module[: max(len(module) - node.level, 0)])
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if not target else [target]
            elif node.module and node.module.split(".")[0] == "nanochat_hf":
                names = [node.module.split(".")[1:] or [a.name for a in node.names][:1]]
            else:
                continue
            parts.update(t[0] for t in names if t)
        elif isinstance(node, ast.Import):
            parts.update(a.name.split(".")[1] for a in node.names if a.name.startswith("nanochat_hf."))
    return parts


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_module_imports_a_layer_above_its_own(package):
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(imported_parts(path) - ALLOWED[package])
        for path in sorted((PACKAGE / package).rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_reader_sees_upward_imports(tmp_path, monkeypatch):
    """The check can fail: relative, absolute and function-level imports of training/ are all found."""
    fake = PACKAGE / "integration" / "x.py"
    source = "from ..training import callbacks\nimport nanochat_hf.conversion.files\n"
    source += "def f():\n    from .. import serving\n"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    assert imported_parts(fake) == {"training", "conversion", "serving"}
