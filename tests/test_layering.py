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
# the one exception: optim/trainer_mixin.py, the mixin's deprecated old home, re-exports it from integration/ so that
# code that imported it keeps working (with a FutureWarning); nothing in the package imports it
EXCEPTIONS = {"optim/trainer_mixin.py": {"integration"}}


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
        str(path.relative_to(PACKAGE)): sorted(
            imported_parts(path) - ALLOWED[package] - EXCEPTIONS.get(str(path.relative_to(PACKAGE)), set())
        )
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


def test_the_mixins_old_import_path_still_works_with_a_warning(monkeypatch):
    """Issue 52: code that imported the mixin from its old home (nanochat_hf.optim.trainer_mixin, before it moved to
    integration/) keeps working and is told the new import; the package itself never imports the old path."""
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "nanochat_hf.optim.trainer_mixin", raising=False)
    with pytest.warns(FutureWarning, match=r"from nanochat_hf\.integration import NanoChatOptimizerMixin"):
        old = importlib.import_module("nanochat_hf.optim.trainer_mixin")
    from nanochat_hf.integration import NanoChatOptimizerMixin, check_distributed_setup

    assert old.NanoChatOptimizerMixin is NanoChatOptimizerMixin
    assert old.check_distributed_setup is check_distributed_setup
    users = [p for p in PACKAGE.rglob("*.py") if "trainer_mixin" in p.read_text() and p.name != "trainer_mixin.py"]
    assert users == []
