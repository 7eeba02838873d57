"""The measurements of docs/reward-models.md, stage by stage, on SmolLM2-135M-Instruct. Each step
takes the output of the one before by its path, so that code changed between steps (a stage's
key holds its code) does not redo them:

    python docs/reward-models/measure.py rollouts RUN_DIR                   # 40 MBPP problems x 8
    python docs/reward-models/measure.py reward-model RUN_DIR SCORED        # trained, held out
    python docs/reward-models/measure.py best-of-n RUN_DIR SCORED REWARD_MODEL  # its rerank.json
    python docs/reward-models/measure.py rl RUN_DIR REWARD_MODEL [ITERATIONS]   # GRPO on it alone
    python docs/reward-models/measure.py plot RL_FOLDER PNG                 # as on the page
    python docs/reward-models/measure.py before-after RUN_DIR SCORED REWARD_MODEL RL_FOLDER
"""

import json
import logging
import sys
from pathlib import Path

from codepost.pipeline.checkpoints.manifest import read_manifest
from codepost.pipeline.data.rows import read_rows
from codepost.pipeline.reporting.evaluations import problem_counts
from codepost.pipeline.reporting.plots import plot_curves
from codepost.pipeline.reporting.rerank import RERANK_FILE, RerankConfig, rerank
from codepost.pipeline.reporting.stats import compare_sampled, wilson_interval
from codepost.pipeline.resources import close_all
from codepost.pipeline.stages import Artifacts, get_stage, run_stage
from codepost.pipeline.stages.reward_model import RewardModelConfig
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.rollouts import RolloutsConfig
from codepost.settings.config import Settings

MODEL = "embedded:smollm2-135m-instruct"
# The 40 MBPP training problems the learning run's difficulty filter found most within reach
# (docs/learning-mbpp-2/filter-pass-rates.json): problems whose samples all fail make no pair.
WITHIN_REACH = json.loads(
    (Path(__file__).parents[1] / "learning-mbpp-2/filter-pass-rates.json").read_text()
)["problems"]
PROBLEMS = sorted(WITHIN_REACH, key=lambda task: (-WITHIN_REACH[task]["pass_rate"], task))[:40]
ENGINE = {"cpu_threads": 1}  # a shared 2-core machine: docs/stages.md


def made(stage: str, config: Settings, inputs: Artifacts, out_dir: Path, artifact: str) -> Path:
    """``stage`` run as in a run (keyed, resumed), and the path of the ``artifact`` it makes."""
    return Path(str(getattr(run_stage(get_stage(stage), config, inputs, out_dir), artifact)))


def rollouts(run_dir: Path, checkpoint: str = MODEL) -> Path:
    config = RolloutsConfig.model_validate(
        {
            "problems": {"source": "mbpp", "split": "train", "task_ids": PROBLEMS, "limit": None},
            "sampling": {"num_generations": 8, "temperature": 0.7, "max_tokens": 256},
            "scoring": {"workers": 3},
            "engine": ENGINE,
        }
    )
    inputs = Artifacts(checkpoint=checkpoint)
    return made("rollouts", config, inputs, run_dir / "rollouts", "scored")


def reward_model(run_dir: Path, scored: Path) -> Path:
    config = RewardModelConfig.model_validate(
        {
            "pairs": {
                "strategies": ["all_pairs"],
                "max_pairs_per_prompt": 4,  # 2 minutes a step of 4 pairs on this machine
                "held_out_fraction": 0.3,
                "seed": 0,
            },
            "min_pairs": 48,
            "training": {
                "learning_rate": 2e-5,
                "num_train_epochs": 1,
                "per_device_train_batch_size": 4,
                "max_length": 512,
                "logging_steps": 5,
                "seed": 0,
            },
        }
    )
    inputs = Artifacts(scored=str(scored), checkpoint=MODEL)
    return made("reward-model", config, inputs, run_dir / "reward-model", "reward_model")


def best_of_n(run_dir: Path, scored: Path, folder: Path) -> Path:
    """Best-of-n among the 8 samples of each problem the reward model did not train on."""
    rerank(RerankConfig(reward_model=str(folder)), read_rows(scored), run_dir / RERANK_FILE)
    return run_dir / RERANK_FILE


def rl(run_dir: Path, folder: Path, iterations: int) -> Path:
    config = RLConfig.model_validate(
        {
            "problems": {
                "source": "mbpp",
                "split": "train",
                "limit": None,
                "shuffle_seed": 0,
                "task_ids": read_manifest(folder).metrics["train_problems"],
            },
            "iterations": iterations,
            "prompts_per_iteration": 3,
            "dynamic_sampling_metric": "reward",
            "max_sampling_rounds": 1,
            "sampling": {"num_generations": 4, "temperature": 0.7, "max_tokens": 192},
            # vLLM: transformers' generate took 18 of the first iteration's 23 minutes here
            "engine": ENGINE,
            "scoring": {
                "reward": {"weights": {"test": 0.0}},  # the learned reward alone
                "learned": {"rm": {"reward_model": str(folder), "weight": 1.0}},
                "workers": 3,
            },
            "update": {
                "learning_rate": 2e-5,
                "policy_loss": {"name": "vanilla", "clip_high": 0.28},
                "minibatch_size": 6,
                "micro_batch_size": 6,
                "mask_truncated": True,
                "sampler_is_cap": 2.0,
            },
        }
    )
    return made("rl", config, Artifacts(checkpoint=MODEL), run_dir / "rl-learned", "checkpoint")


def plot(rl_folder: Path, png: Path) -> Path:
    """The learned reward and the tests' pass rate (Wilson interval) of each iteration."""
    rows = [json.loads(line) for line in (rl_folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        samples = int(row["data/samples"])
        passed = round(row["reward/pass_rate"] * samples)
        row["reward/pass_rate_ci95"] = wilson_interval(passed, samples)
    panels = {"learned reward (reward model's score)": ["reward/rm/mean"],
              "tests' pass rate (95% interval)": ["reward/pass_rate"]}  # fmt: skip
    title = "GRPO on the learned reward alone: SmolLM2-135M-Instruct, MBPP"
    return plot_curves(rows, png, x="iteration", panels=panels, title=title, error_bars=True)


def before_after(run_dir: Path, scored: Path, folder: Path, rl_folder: Path) -> Path:
    """The RL run's last policy against its start on the same 40 problems, 8 samples each at the
    rollouts' settings: pass@1 paired by problem (sign-flip p) on the problems the reward model
    and RL trained on, and on the others."""
    newest = max((rl_folder / "checkpoints").glob("iteration-*"))
    after = rollouts(run_dir, str(newest))
    trained = set(read_manifest(folder).metrics["train_problems"])

    before_counts = problem_counts(read_rows(scored))
    after_counts = problem_counts(read_rows(after))
    result: dict = {"start": MODEL, "end": str(newest), "end_scored": str(after)}
    for part, tasks in (
        ("trained", sorted(trained)),
        ("held_out", sorted(set(before_counts) - trained)),
    ):
        comparison = compare_sampled(
            {t: before_counts[t] for t in tasks}, {t: after_counts[t] for t in tasks}, k=1
        )
        result[part] = comparison.model_dump()
    result["problems"] = {
        t: {"start": before_counts[t], "end": after_counts[t]} for t in before_counts
    }
    out = run_dir / "before-after.json"
    out.write_text(json.dumps(result, indent=1))
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    step, run_dir = sys.argv[1], Path(sys.argv[2])
    try:
        if step == "rollouts":
            print(rollouts(run_dir))
        elif step == "reward-model":
            print(reward_model(run_dir, Path(sys.argv[3])))
        elif step == "best-of-n":
            print(best_of_n(run_dir, Path(sys.argv[3]), Path(sys.argv[4])))
        elif step == "before-after":
            paths = [Path(arg) for arg in sys.argv[3:6]]
            print(before_after(run_dir, *paths))
        elif step == "rl":
            print(rl(run_dir, Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 20))
        else:
            print(plot(run_dir, Path(sys.argv[3])))
    finally:
        close_all()  # the sampling engine and the sandbox pool
