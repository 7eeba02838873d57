"""Dependencies point one way, flows -> pipeline -> verifiers -> sandbox -> settings (the floor
every layer may import), and only flows/ imports Prefect: read from the sources' import
statements (relative or absolute), nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from package_layout import LAYERS

ROOT = Path(__file__).resolve().parents[1]


def _imported(path: Path) -> set[str]:
    """The modules ``path`` imports, as dotted names under ``codepost`` where they are ours."""
    package = ["codepost", *path.relative_to(ROOT).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            # `from .. import verifiers` imports a package, not a name
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _sources(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


def _edges() -> dict[tuple[str, str], set[str]]:
    """(importing layer, imported layer) -> the imports that make that edge."""
    edges: dict[tuple[str, str], set[str]] = {}
    for layer in LAYERS:
        for path in _sources(layer):
            for name in _imported(path):
                top, _, rest = name.partition(".")
                other = rest.split(".")[0]
                if top == "codepost" and other in LAYERS and other != layer:
                    edges.setdefault((layer, other), set()).add(f"{path.relative_to(ROOT)}: {name}")
    return edges


def test_no_import_points_up_the_layers() -> None:
    edges = _edges()
    upward = {
        edge: sorted(imports)
        for edge, imports in edges.items()
        if LAYERS.index(edge[1]) > LAYERS.index(edge[0])
    }
    assert not upward
    # a reader that found no imports would pass the check above: the layers' edges are there
    assert {
        ("flows", "pipeline"),
        ("pipeline", "verifiers"),
        ("verifiers", "sandbox"),
        ("verifiers", "settings"),
        ("pipeline", "settings"),
        ("flows", "settings"),
    } <= set(edges)


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_only_flows_import_prefect(layer: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(layer)
        for name in _imported(path)
        if name.split(".")[0] in {"prefect", "prefect_dask"}
    }
    assert not wrong, sorted(wrong)
