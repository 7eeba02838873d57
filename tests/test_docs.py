"""The documentation site builds with ``--strict`` (a page missing from the nav, a broken link,
anchor or image fails), its reference pages hold what the registries and config models hold,
and what the README and the site show exists: every run config is one the pipeline accepts,
every repository path, ``codepost.`` name and ``from codepost`` import resolves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config

from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.rl.algorithms import ADVANTAGE_ESTIMATORS, ALGORITHMS, POLICY_LOSSES
from codepost.pipeline.rl.metric_names import DECLARED
from codepost.pipeline.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``mkdocs build --strict`` builds it: any warning aborts the build."""
    site_dir = tmp_path_factory.mktemp("site")
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site_dir), strict=True))
    return site_dir


def _text(html: Path) -> str:
    return html.read_text(encoding="utf-8")


def test_the_site_builds_with_every_page_and_image(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "learning-mbpp/index.html"):
        assert (site / page).is_file(), page
    for image in (ROOT / "docs").rglob("*.png"):
        assert (site / image.relative_to(ROOT / "docs")).is_file(), image


def test_the_reference_pages_list_what_the_code_registers(site: Path) -> None:
    stages = _text(site / "reference/stages/index.html")
    assert all(f"<code>{name}</code>" in stages for name in STAGES)
    algorithms = _text(site / "reference/algorithms/index.html")
    for registry in (ALGORITHMS, ADVANTAGE_ESTIMATORS, POLICY_LOSSES):
        assert all(f"<code>{name}</code>" in algorithms for name in registry)
    metrics = _text(site / "reference/metrics/index.html")
    assert all(f"<code>{name}</code>" in metrics for name in DECLARED)
    config = _text(site / "reference/config/index.html")
    for model in [PostTrainConfig, *(stage.config for stage in STAGES.values())]:
        section = config.split(f'id="{model.__name__.lower()}"', 1)[1].split("<h2", 1)[0]
        assert all(f"<code>{field}</code>" in section for field in model.model_fields), model


def _run_configs() -> list[tuple[str, str]]:
    """Every YAML block of the README and the site that is (part of) a run's config: one with a
    top-level key of PostTrainConfig (other YAML, such as an accelerate config, is left alone)."""
    blocks = []
    for page in PAGES:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and set(data) & set(PostTrainConfig.model_fields):
                blocks.append((str(page.relative_to(ROOT)), block))
    return blocks


@pytest.mark.parametrize(("page", "block"), _run_configs())
def test_the_configs_the_documentation_shows_are_accepted(
    page: str, block: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the paths they name are relative to a clone
    PostTrainConfig.model_validate(yaml.safe_load(block))


REPO_PATH = re.compile(
    r"`((?:pipeline|verifiers|sandbox|flows|tests|benchmarks|configs|scripts|docs)/[\w./-]*)`"
)
DOTTED = re.compile(r"`(codepost(?:\.\w+)+)")
IMPORT = re.compile(r"^(?:from codepost[\w.]* import [\w, ]+|import codepost[\w.]*)$", re.M)


def _resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names: its longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_paths_names_and_imports_the_documentation_shows_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [path for path in REPO_PATH.findall(text) if not (ROOT / path).exists()]
    assert not missing, f"{page.name} names files that are not there: {missing}"
    for dotted in DOTTED.findall(text):
        _resolve(dotted)
    for statement in IMPORT.findall(text):
        exec(statement, {})
