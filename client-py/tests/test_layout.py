"""The package's layers (``ringfeed/__init__.py``, "Layout"): each subpackage imports only what lies
below it, and every subpackage ships in the wheel.

The imports are read from the source (every ``import`` statement, those inside functions too), not
from a running interpreter, so an import that only a GPU machine or a rare branch executes counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ringfeed"

#: What each layer may import of ``ringfeed`` besides its own modules (prefixes of module names).
ALLOWED = {
    "ringfeed.formats": (),
    "ringfeed.wire": ("ringfeed.formats", "ringfeed._errors", "ringfeed._version"),
    "ringfeed.gpu": ("ringfeed._errors",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ringfeed_imports(path: Path) -> set[str]:
    """The ``ringfeed`` modules ``path`` imports (``from . import x`` names the module ``x``)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.add(name)
            # `from . import x` and `from .pkg import mod` may name modules, not attributes.
            out.update(f"{name}.{a.name}" for a in node.names if (PACKAGE.parent / name.replace(".", "/")).is_dir())
    return {m for m in out if m == "ringfeed" or m.startswith("ringfeed.")}


def modules_of(layer: str) -> list[Path]:
    return sorted((PACKAGE.parent / layer.replace(".", "/")).glob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    """formats imports nothing else of ringfeed; wire only formats and the leaves _errors and _version;
    gpu only _errors: none of them imports the loader, and neither formats nor wire imports gpu."""
    allowed = (layer, *ALLOWED[layer])
    assert modules_of(layer), layer
    for path in modules_of(layer):
        for name in ringfeed_imports(path):
            ok = any(name == a or name.startswith(a + ".") for a in allowed)
            assert ok, f"{module_name(path)} imports {name}; {layer} may import only {', '.join(allowed)}"


def test_every_subpackage_is_in_the_wheel() -> None:
    """client-py/pyproject.toml lists its packages explicitly: each directory of ringfeed/ with an
    __init__.py is in that list, so the pure-Python wheel never lacks a layer."""
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    m = re.search(r"^packages = \[([^\]]*)\]", text, re.M)
    assert m is not None
    listed = set(re.findall(r'"([^"]+)"', m.group(1)))
    found = {module_name(p) for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts}
    assert listed == found
