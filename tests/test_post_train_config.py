"""The run config: its default uses only what ships with the package, and settings that cannot
chain are refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.post_train import (
    PostTrainConfig,
    derive_seed,
    embedded_default,
    seeded,
    with_run_model,
)
from codepost.pipeline.stages.registry import kept_problems
from codepost.pipeline.stages.rl import RLConfig
from codepost.pipeline.stages.rollouts import RolloutsConfig
from codepost.settings.walk import settings_of
from codepost.verifiers.problems import packaged_path

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "config",
    [
        embedded_default(),
        *(
            PostTrainConfig.model_validate(yaml.safe_load((REPO / "configs" / name).read_text()))
            for name in ("learning-mbpp.yaml", "gpu-1xh100.yaml")
        ),
    ],
    ids=["embedded-default", "learning-mbpp", "gpu-1xh100"],
)
def test_every_default_problem_set_loads_from_the_package(config):
    sets = settings_of(config, ProblemSet)
    assert sets
    assert {s.source for s in sets} <= {"humaneval", "mbpp"}
    for problem_set in sets:
        assert load_problem_set(problem_set)


def test_the_main_job_evaluates_on_all_of_humaneval():
    (evaluation,) = embedded_default().evaluations.values()
    assert evaluation.problems.limit is None
    assert len(load_problem_set(evaluation.problems)) == 164


def test_task_ids_choose_problems_of_the_split_in_their_order_and_unknown_ones_are_named():
    chosen = ProblemSet(source="mbpp", split="train", task_ids=["970", "666"], limit=1)
    assert list(load_problem_set(chosen)) == ["970"]
    with pytest.raises(ValueError, match=r"no problem 12, 9999 \(task_ids\)"):
        load_problem_set(chosen.model_copy(update={"task_ids": ["12", "666", "9999"]}))


def test_a_stage_whose_inputs_no_earlier_stage_makes_is_refused():
    with pytest.raises(ValueError, match=r"stages\[1\] \(dpo\) needs pairs"):
        PostTrainConfig(stages=["sft", "dpo"])
    with pytest.raises(ValueError, match=r"stages\[0\] \(pairs\) needs scored"):
        PostTrainConfig(stages=["pairs", "rl", "dpo"])
    assert PostTrainConfig(stages=["sft", "rollouts", "pairs", "dpo"])


def test_pairs_from_rl_rollouts_need_several_policies():
    with pytest.raises(ValueError, match="set several_policies"):
        PostTrainConfig(stages=["sft", "rl", "pairs", "dpo"])
    offline = {"stage": "pairs", "config": {"several_policies": True}}
    assert PostTrainConfig(stages=["sft", "rl", offline, "dpo"])


def test_the_same_stage_twice_needs_a_name_of_its_own():
    with pytest.raises(ValueError, match="a second 'rl' stage needs a `name`"):
        PostTrainConfig(stages=["rl", "rl"])
    config = PostTrainConfig(
        stages=["rl", {"stage": "rl", "name": "rl-2", "config": {"iterations": 2}}]
    )
    assert config.entry("rl-2").config.iterations == 2
    with pytest.raises(ValueError, match=r"Input tag 'nope'"):
        PostTrainConfig(stages=["nope"])


def test_a_stage_keeps_its_own_model_settings_and_takes_the_run_model_otherwise():
    from codepost.pipeline.model_config import ModelConfig

    run_model = ModelConfig(name_or_path="base", dtype="bfloat16")
    rl = RLConfig.model_validate({"model": {"lora_r": 16, "name_or_path": "ignored"}})
    model = with_run_model(rl, run_model).model
    assert (model.name_or_path, model.lora_r, model.dtype) == ("base", 16, "bfloat16")
    assert with_run_model(RLConfig(), run_model).model == run_model


def test_every_stage_seed_derives_from_the_run_seed_unless_set():
    rl = RLConfig.model_validate({"sampling": {"seed": 7}})
    seeded_rl = seeded(rl, derive_seed(3, "rl"))
    assert seeded_rl.seed == derive_seed(3, "rl") != derive_seed(3, "sft") != derive_seed(4, "rl")
    assert seeded_rl.sampling.seed == 7  # set explicitly: kept
    assert seeded_rl.engine.seed == derive_seed(3, "rl")


def test_a_filter_hands_its_problems_to_the_stages_after_it(tmp_path, caplog):
    rl = RLConfig(problems=ProblemSet(source="mbpp", split="train", shuffle_seed=4, limit=8))
    assert kept_problems(rl, None) is rl
    folder = tmp_path / "filter" / "problems"
    folder.mkdir(parents=True)
    (folder / "problems.jsonl").write_text("".join(f'{{"task_id": "{i}"}}\n' for i in range(8)))
    handed = kept_problems(rl, str(folder))
    assert handed.problems.source == str(folder / "problems.jsonl")
    assert (handed.problems.split, handed.problems.shuffle_seed, handed.problems.limit) == (
        "all",
        4,
        8,
    )
    assert not caplog.records  # all 8 kept problems fit the limit

    # More kept problems than the stage's limit: it still takes its limit, and says so.
    (folder / "problems.jsonl").write_text("".join(f'{{"task_id": "{i}"}}\n' for i in range(10)))
    assert kept_problems(RolloutsConfig(), str(folder)).problems.limit == 16
    assert kept_problems(rl, str(folder)).problems.limit == 8
    assert [r.getMessage() for r in caplog.records] == [
        "8 of the 10 problems the filter kept to train on (problems.limit 8); "
        "problems.limit: null takes them all"
    ]


def test_an_arm_branches_after_a_named_stage_and_takes_what_was_made_by_then():
    arms = ["sft", "filter", "rl", {"stage": "rft", "after": "filter"}]
    assert PostTrainConfig(stages=arms)
    with pytest.raises(ValueError, match="after='rl' names no stage before it"):
        PostTrainConfig(stages=["sft", {"stage": "rft", "after": "rl"}, "rl"])
    # After sft there were no scored rollouts yet: pairs branching from it has nothing to mine.
    with pytest.raises(ValueError, match=r"stages\[2\] \(pairs\) needs scored"):
        PostTrainConfig(stages=["sft", "rl", {"stage": "pairs", "after": "sft"}, "dpo"])
    with pytest.raises(ValueError, match="held-out take problems_from a filter"):
        PostTrainConfig(stages=["sft"], evaluations={"held-out": {"problems_from": "held_out"}})


HOLDS_OUT = {"stage": "filter", "config": {"held_out_fraction": 0.3}}


def test_a_stage_that_could_train_on_held_out_problems_is_refused_naming_both_stages():
    """A held-out evaluation must not measure problems the model was fine-tuned on."""
    # The stages that take a filter's problems train on the part it hands on, never the rest.
    assert PostTrainConfig(stages=["sft", HOLDS_OUT, "rl", {"stage": "rft", "after": "filter"}])
    assert PostTrainConfig(stages=[HOLDS_OUT, "rollouts", "pairs", "dpo"])
    with pytest.raises(
        ValueError,
        match=r"stages\[1\] \(sft\) trains on its own problems \(mbpp split train\), which may "
        r"hold problems that stages\[0\] \(filter\) sets aside for evaluation",
    ):
        PostTrainConfig(stages=[HOLDS_OUT, "sft"])
    with pytest.raises(
        ValueError,
        match=r"stages\[3\] \(dpo\) trains on pairs made from the problems stages\[0\] "
        r"\(rollouts\) read \(mbpp split train\), which may hold problems that stages\[1\] "
        r"\(filter\) sets aside",
    ):
        PostTrainConfig(stages=["rollouts", HOLDS_OUT, "pairs", "dpo"])
    with pytest.raises(ValueError, match=r"stages\[2\] \(rl\) trains on problems made from the "
                       r"problems stages\[1\] \(filter\) read"):  # fmt: skip
        PostTrainConfig(stages=[HOLDS_OUT, {"stage": "filter", "name": "again"}, "rl"])
    # Problems the filter does not rate, or none held out: nothing to keep apart.
    mbpp_test = {"stage": "sft", "config": {"problems": {"source": "mbpp", "split": "test"}}}
    assert PostTrainConfig(stages=[HOLDS_OUT, mbpp_test])
    assert PostTrainConfig(stages=["filter", "sft"])


def test_two_problem_sets_may_share_problems_where_their_source_split_and_ids_meet(tmp_path):
    mbpp = ProblemSet(source="mbpp", split="train")
    local = tmp_path / "mbpp.jsonl"
    local.symlink_to(packaged_path("mbpp"))
    assert mbpp.may_share_problems(ProblemSet(source=str(local), split="all"))  # one file
    copy = tmp_path / "copy.jsonl"  # the same problems under another name: a copy was accepted
    copy.write_bytes(packaged_path("mbpp").read_bytes())
    assert mbpp.may_share_problems(ProblemSet(source=str(copy), split="train"))
    assert mbpp.may_share_problems(
        ProblemSet(source="humaneval", more_sources=["mbpp"], split="all")
    )
    assert not mbpp.may_share_problems(ProblemSet(source="mbpp", split="test"))
    assert not mbpp.may_share_problems(ProblemSet(source="humaneval", split="all"))
    ids = mbpp.model_copy(update={"task_ids": ["601", "602"]})
    assert ids.may_share_problems(mbpp.model_copy(update={"task_ids": ["602"]}))
    assert not ids.may_share_problems(mbpp.model_copy(update={"task_ids": ["700"]}))


def test_arms_start_from_the_branch_point_and_every_checkpoint_is_measured_on_the_filtered_problems(
    tmp_path, monkeypatch
):
    """The run loop with a stand-in executor (each stage's outputs are named folders): the RFT
    arm gets SFT's checkpoint and the filter's problems, not RL's; the evaluations on the
    filter's problems run for base and SFT once the filter has run, then after every arm."""
    from codepost.pipeline import post_train
    from codepost.pipeline.stages.registry import Artifacts
    from codepost.pipeline.stages.scoring import SandboxSettings

    # Each key holds the sandbox image's id: the Docker boundary, reached in the registry tests.
    monkeypatch.setattr(SandboxSettings, "content_digests", lambda self: {"sandbox image": "id"})

    calls: list[tuple[str, Artifacts]] = []

    def execute(stage, config, inputs, out_dir, label, launch=None):
        calls.append((label, inputs))
        made = {
            "checkpoint": f"ckpt:{label}",
            "problems": f"problems:{label}",
            "scored": f"scored:{label}",
            "evaluation": str(out_dir),
        }
        return Artifacts(**{kind: made[kind] for kind in stage.makes})

    reported: list[dict[str, str | None]] = []

    def write_report(run_dir, evaluations, started_from):
        reported.append(dict(started_from))
        return run_dir

    monkeypatch.setattr(post_train, "write_report", write_report)
    monkeypatch.setattr(post_train, "stage_rows", lambda evaluations, started_from: [])
    config = PostTrainConfig(
        run_dir=str(tmp_path / "run"),
        stages=["sft", "filter", "rl", {"stage": "rft", "after": "filter"}],
        evaluations={
            "mbpp": {},
            "train": {
                "problems_from": "train",
                "greedy": False,
                "sampled": True,
                "sampling": {"num_generations": 2},
                "ks": [1],
            },
        },
    )
    post_train.run_post_train(config, execute=execute)
    inputs = dict(calls)
    assert [label for label, _ in calls] == [
        "base/mbpp",
        "sft", "sft/mbpp",
        "filter", "base/train", "sft/train",
        "rl", "rl/mbpp", "rl/train",
        "rft", "rft/mbpp", "rft/train",
    ]  # fmt: skip
    assert inputs["rft"] == Artifacts(checkpoint="ckpt:sft", problems="problems:filter")
    assert inputs["rl"] == inputs["rft"]
    assert inputs["base/train"].problems == inputs["rft/train"].problems == "problems:filter"
    assert inputs["rft/train"].checkpoint == "ckpt:rft" and inputs["rft/mbpp"].problems is None
    # The report compares each arm with the checkpoint it trained from, not the arm before it.
    assert reported == [{"sft": "base", "rl": "sft", "rft": "sft"}]

    calls.clear()  # without the base model's evaluations, SFT's are the first
    post_train.run_post_train(
        config.model_copy(update={"evaluate_base": False, "run_dir": str(tmp_path / "b")}),
        execute=execute,
    )
    assert [label for label, _ in calls][:4] == ["sft", "sft/mbpp", "filter", "sft/train"]
    assert reported[-1] == {"sft": None, "rl": "sft", "rft": "sft"}
