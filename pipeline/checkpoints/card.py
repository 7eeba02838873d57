"""The model card of a published checkpoint: ``README.md`` as huggingface_hub's ``ModelCard``
writes it (YAML metadata, then markdown), so that a checkpoint folder, pushed to the hub or read
where it is, says what it is: its base model, the stage that made it and from what, its data,
its config, and how it did on each evaluation of it, with 95% intervals.

The card is written when the checkpoint is published, from its manifest, and rewritten each time
an evaluation of it finishes (:func:`add_evaluation`), which is why the manifest does not hash it
(``manifest.CARD``). It keeps its evaluations in its own metadata (under ``codepost:``), and
makes the hub's ``model-index`` from them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..atomic import write_text
from .manifest import CARD, CheckpointManifest, is_published, read_manifest

log = logging.getLogger(__name__)

STATE_NOTE = (
    " `trainer_state/` (when present) holds the optimizer's state, which continues training "
    "exactly; it is dropped from an RL iteration once a newer one is published, and not pushed."
)
# Problem sets codepost ships or names, by the hub data set each comes from (verifiers/data/).
HUB_DATASETS = {
    "humaneval": "openai/openai_humaneval",
    "mbpp": "google-research-datasets/mbpp",
    "mbpp-sanitized": "google-research-datasets/mbpp",
}


def write_card(folder: Path, manifest: CheckpointManifest, evaluations: Sequence[Any] = ()) -> Path:
    """Write ``folder``'s card from its manifest and the summaries of its evaluations."""
    return write_text(Path(folder) / CARD, render_card(manifest, list(evaluations)))


def add_evaluation(checkpoint: str | Path, evaluation: Mapping[str, Any]) -> bool:
    """Add an evaluation (an ``evaluation.json`` record) of ``checkpoint`` to its card, replacing
    an earlier one of the same problems; nothing when ``checkpoint`` is not a published folder
    (a hub id, the base model). A card that cannot be written is logged, not raised: the
    evaluation is done and recorded. Returns whether the card was written."""
    folder = Path(checkpoint)
    if not is_published(folder):
        return False
    summary = _summary(evaluation)
    kept = [e for e in card_evaluations(folder) if e["fingerprint"] != summary["fingerprint"]]
    try:
        write_card(folder, read_manifest(folder), [*kept, summary])
    except OSError as exc:
        log.warning("the card of %s keeps its earlier evaluations: %s", folder, exc)
        return False
    return True


def card_evaluations(folder: Path) -> list[dict[str, Any]]:
    """The evaluations ``folder``'s card holds (none when it has no card)."""
    from huggingface_hub import metadata_load

    path = Path(folder) / CARD
    metadata = metadata_load(path) if path.is_file() else None
    return list(((metadata or {}).get("codepost") or {}).get("evaluations") or [])


def _summary(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """What the card keeps of an evaluation: its problems and each run's pass@k, intervals and
    counts."""
    problems = evaluation.get("problems") or {}
    runs = {
        run: {
            key: scores[key]
            for key in scores
            if key.startswith("pass@") or key in ("passed", "samples", "temperature")
        }
        for run in ("greedy", "sampled")
        if (scores := evaluation.get(run))
    }
    return {
        "problems": problems.get("source", "?"),
        "split": problems.get("split", "test"),
        "num_problems": evaluation.get("num_problems"),
        "fingerprint": evaluation.get("problems_fingerprint")
        or f"{problems.get('source')}:{problems.get('split')}",
        "runs": runs,
    }


def render_card(manifest: CheckpointManifest, evaluations: list[dict[str, Any]]) -> str:
    """The card's text: huggingface_hub's metadata block, then the markdown."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    name = f"{manifest.stage}/{manifest.version}"
    base_id, base_note = _base(manifest.base_model)
    results = [
        EvalResult(
            task_type="text-generation",
            dataset_type=HUB_DATASETS.get(e["problems"], e["problems"]),
            dataset_name=e["problems"],
            dataset_split=e["split"],
            metric_type=key,
            metric_value=value,
            metric_name=f"{run} {key}",
        )
        for e in evaluations
        for run, scores in e["runs"].items()
        for key, value in scores.items()
        if key.startswith("pass@") and not key.endswith("_ci95") and value == value  # not NaN
    ]
    data = ModelCardData(
        base_model=base_id,
        datasets=_hub_datasets(manifest.config) or None,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["codepost", manifest.stage, "code"],
        model_name=name,
        eval_results=results or None,
        codepost={"stage": manifest.stage, "version": manifest.version, "evaluations": evaluations},
    )
    body = "\n".join(
        [
            f"# {name}",
            "",
            f"A checkpoint made by codepost's `{manifest.stage}` stage from "
            f"`{manifest.parent}`, on base model `{manifest.base_model}`"
            + (f" ({base_note})." if base_note else "."),
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model = AutoModelForCausalLM.from_pretrained("<this folder or hub repo>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this folder or hub repo>")',
            "```",
            "",
            "## Evaluation",
            "",
            *_evaluation_table(evaluations),
            "",
            "## Training",
            "",
            "| | |",
            "| --- | --- |",
            f"| stage | `{manifest.stage}` (version `{manifest.version}`) |",
            f"| trained from | `{manifest.parent}` |",
            f"| base model | `{manifest.base_model}` |",
            f"| updates (optimizer steps; RL: iterations) | {manifest.steps} |",
            f"| created | {manifest.created_at} |",
            f"| code version | `{manifest.code_version}` |",
            *(f"| data: {key} | `{value}` |" for key, value in manifest.data.items()),
            "",
            *_details("Metrics at the end of the stage", _metrics(manifest.metrics)),
            *_details(
                "Config", ["```yaml", yaml.safe_dump(manifest.config, sort_keys=False), "```"]
            ),
            "## Files",
            "",
            "`manifest.json` lists the sha256 of each file but this card: `codepost checkpoints "
            "verify` checks them." + (STATE_NOTE if manifest.state else ""),
            "",
        ]
    )
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


def _base(base_model: str | None) -> tuple[str | None, str]:
    """The hub id of the base model for the card's metadata (None when it is a folder), and a
    note on how it was made (an embedded model)."""
    from ..model_config import EMBEDDED_ORIGINS, EMBEDDED_PREFIX

    if base_model is None:
        return None, ""
    if base_model.startswith(EMBEDDED_PREFIX):
        origin, how = EMBEDDED_ORIGINS.get(base_model.removeprefix(EMBEDDED_PREFIX), (None, ""))
        return origin, f"{origin}, {how}" if origin else ""
    is_hub_id = base_model.count("/") == 1 and not Path(base_model).expanduser().exists()
    return (base_model if is_hub_id else None), ""


def _hub_datasets(config: Mapping[str, Any]) -> list[str]:
    """The hub data sets the stage's problems come from."""
    problems = config.get("problems") or {}
    sources = [problems.get("source"), *(problems.get("more_sources") or [])]
    hub = [
        HUB_DATASETS.get(s) or (s.partition(":")[0] if s.count("/") == 1 else None)
        for s in sources
        if isinstance(s, str)
    ]
    return sorted({h for h in hub if h and not Path(h).exists()})


def _evaluation_table(evaluations: list[dict[str, Any]]) -> list[str]:
    if not evaluations:
        return ["Not evaluated yet: an evaluation of this folder (`codepost evaluate`, a run's) "
                "adds its results here."]  # fmt: skip
    rows = [
        "| problems | split | decoding | metric | value | 95% interval | passed / samples |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in evaluations:
        for run, scores in e["runs"].items():
            for key, value in scores.items():
                if key.startswith("pass@") and not key.endswith("_ci95"):
                    low_high = scores.get(f"{key}_ci95")
                    interval = f"[{low_high[0]:.4f}, {low_high[1]:.4f}]" if low_high else ""
                    counts = f"{scores.get('passed')} / {scores.get('samples')}"
                    rows.append(
                        f"| {e['problems']} ({e['num_problems']}) | {e['split']} | {run} | {key} "
                        f"| {value:.4f} | {interval} | {counts} |"
                    )
    return [*rows, "", "Intervals: Wilson for greedy pass@1, a bootstrap over problems for "
            "sampled pass@k."]  # fmt: skip


def _metrics(metrics: Mapping[str, Any]) -> list[str]:
    scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    return [
        "| metric | value |",
        "| --- | --- |",
        *(f"| {k} | {v:.6g} |" for k, v in scalars.items()),
    ]


def _details(summary: str, lines: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *lines, "", "</details>", ""]
