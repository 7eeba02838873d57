"""One config mechanism: every field of a command's config is a dotted flag derived from the
pydantic classes, set over the YAML (or the default) keeping every other setting; --help lists
them; a removed spelling is refused naming the new one (exit 2); the command stays light."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from typing import Annotated

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from codepost.flows import cli
from codepost.pipeline.nightly.series import NightlyConfig
from codepost.pipeline.post_train import PostTrainConfig, embedded_default
from codepost.pipeline.rl.algorithms import GAEParams
from codepost.pipeline.stages.evaluation import EvalConfig
from codepost.settings.command_line import EXIT_BAD_INPUT
from codepost.settings.config import SettingsError, load_config, settings_help, split_settings
from codepost.verifiers.rewards import RewardConfig


def _run_config(*argv: str, path=None) -> PostTrainConfig:
    flags, rest = split_settings(argv, PostTrainConfig)
    assert rest == []
    return load_config(PostTrainConfig, path, flags, embedded_default())


def test_a_flag_reaches_each_kind_of_field_and_keeps_its_neighbours():
    config = _run_config(
        "--run-dir", "runs/x",
        "--stages.rl.update.learning-rate", "5e-6",
        "--stages.rl.scoring.workers", "2",
        "--stages.rl.scoring.reward.weights.length", "0.5",
        "--stages.sft.model.lora-r", "8",
        "--evaluations.humaneval.sampling.max-tokens=128",
        "--launch.num-processes", "2",
    )  # fmt: skip
    default = embedded_default()
    rl, default_rl = config.entry("rl").config, default.entry("rl").config
    assert config.run_dir == "runs/x" and config.launch.num_processes == 2
    assert rl.update.learning_rate == 5e-6
    assert rl.update.sampler_is_cap == default_rl.update.sampler_is_cap == 2.0  # kept
    assert rl.scoring.workers == 2
    # the stage's own default reward (format and syntax terms) is kept, the new term added
    assert rl.scoring.reward.weights == {"test": 1.0, "format": 0.1, "syntax": 0.1, "length": 0.5}
    assert config.entry("sft").config.model.lora_r == 8
    assert config.evaluations["humaneval"].sampling.max_tokens == 128
    assert config.evaluations["humaneval"].sampling.temperature == 0.8  # kept
    assert config.entry("dpo").config == default.entry("dpo").config


def test_an_estimator_s_settings_follow_the_algorithm_a_flag_chose():
    config = _run_config(
        "--stages.rl.update.algorithm", "ppo", "--stages.rl.update.advantage.lam", "0.9"
    )
    assert config.entry("rl").config.update.advantage == GAEParams(lam=0.9, whiten=True)
    switched = _run_config(
        "--stages.rl.update.advantage.name", "gae", "--stages.rl.update.advantage.gamma", "0.5"
    )
    assert switched.entry("rl").config.update.advantage == GAEParams(gamma=0.5)
    assert switched.entry("rl").config.update.needs_critic


def test_bool_flags_text_flags_and_the_command_s_own_arguments():
    flags, rest = split_settings(
        ["--no-greedy", "--sampled", "checkpoint", "--sampling.num-generations", "4",
         "--output", "out", "--problems.source", "123"],
        EvalConfig,
    )  # fmt: skip
    assert rest == ["checkpoint", "--output", "out"]
    config = load_config(EvalConfig, None, flags)
    assert (config.greedy, config.sampled, config.sampling.num_generations) == (False, True, 4)
    assert config.ks == [1]  # pass@8 needs 8 samples: left out of the default
    assert config.problems.source == "123"  # a text field takes the text as it is


def test_a_list_flag_takes_a_list_or_one_value():
    assert _run_config("--report-to", "[tensorboard, mlflow]").report_to == [
        "tensorboard", "mlflow"
    ]  # fmt: skip
    assert _run_config("--report-to", "tensorboard").report_to == ["tensorboard"]
    with pytest.raises(ValueError, match="--report-to tensorbored: Input should be"):
        _run_config("--report-to", "tensorbored")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--stages.rl.update.lr", "1e-6"], "use --stages.rl.update.learning-rate"),
        (["--stages.rl.update.learnin-rate", "1"], "did you mean learning_rate"),
        (["--stages.rll.iterations", "1"], "no stage named 'rll'"),
        (["--stages.rl.update.advantage.lam", "0.9"], "GRPOParams has no setting 'lam'"),
    ],
)
def test_a_flag_that_names_no_setting_is_refused_naming_it(argv, named):
    with pytest.raises(SettingsError, match=named):
        _run_config(*argv)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {"stages": ["sft", {"stage": "rl", "config": {"update": {"lr": 1e-6}}}]},
            "stages[1].config.update.lr is renamed: use stages[1].config.update.learning_rate",
        ),
        (
            {"stages": [{"stage": "rl", "config": {"update": {"clip_high": 0.28}}}]},
            "update.clip_high is renamed: use stages[0].config.update.policy_loss.clip_high",
        ),
        (
            {"stages": [{"stage": "rl", "config": {"scoring": {"reward": {"format_weight": 1}}}}]},
            "reward.format_weight is renamed: use stages[0].config.scoring.reward.weights.format",
        ),
        (
            {"evaluations": {"humaneval": {"max_tokens": 256}}},
            "evaluations.humaneval.max_tokens is renamed: use "
            "evaluations.humaneval.sampling.max_tokens",
        ),
    ],
)
def test_a_yaml_with_a_removed_spelling_exits_2_naming_the_new_one(
    tmp_path, capsys, settings, named
):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(settings))
    argv = ["run", "--config", str(path), "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert str(path) in err and named in err, err


def test_help_all_lists_every_setting_once_with_its_description_and_default():
    full = settings_help(PostTrainConfig, width=10_000, every=True)
    text = " ".join(full.split())
    assert "--stages.rl.update.learning-rate FLOAT AdamW's, for the policy (default: 1e-06)" in text
    assert "--stages.rl.update.advantage.name {grpo,rloo,reinforce++" in text
    assert "--stages.rl.update.advantage.lam FLOAT (gae) 0: one-step TD" in text
    assert "--evaluations.KEY.sampling.*" in text and "--launch.num-processes INT" in text
    assert "--stages.dpo.model.* as --model.* (ModelConfig)" in text  # said once, referred to
    # a hyperparameter several estimators have is one flag, with what it is in each
    assert (
        "--stages.rl.update.advantage.eps FLOAT (grpo) added to the group std (default: 1e-06); "
        "(reinforce++, reinforce++_baseline) added to the batch variance" in text
    )
    flags = re.findall(r"^  (--\S+)", full, flags=re.MULTILINE)
    assert len(flags) == len(set(flags)) > 150
    assert "\nstages.rl: the stage named rl" in full  # grouped under a heading per section


def test_help_lists_the_settings_a_section_a_line_and_help_all_every_one(capsys):
    for argv in (["run", "--help"], ["run", "--help-all"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 0
    short, full = (text for text in capsys.readouterr().out.split("usage: ")[1:])
    assert "--stages.rl.*  the stage named rl" in short and "--run-dir TEXT" in short
    assert "--stages.rl.update.learning-rate FLOAT" not in short and "--help-all" in short
    assert "--stages.rl.update.learning-rate FLOAT" in full
    assert len(short.splitlines()) < 60 < 250 < len(full.splitlines())


HEAVY = ("torch", "transformers", "trl", "prefect", "vllm", "accelerate", "datasets", "scipy")


def _commands_load(*argvs: list[str]) -> tuple[list[str], str]:
    """The heavy libraries a fresh interpreter holds after running each ``codepost`` command
    line of ``argvs`` in it, and what it wrote on stderr."""
    check = (
        "import sys\n"
        "from codepost.flows.cli import main\n"
        f"for argv in {list(argvs)!r}:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_verify_command_loads_neither_torch_vllm_nor_prefect():
    assert _commands_load(["verify", "--help"]) == ([], "")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["run", "--num-processes", "2"], "did you mean --launch.num-processes"),
        (["evaluate", "--max-tokens", "8"], "did you mean --sampling.max-tokens"),
        (["sample-server", "--backend", "hf"], "did you mean --engine.backend"),
    ],
)
def test_an_option_of_an_earlier_version_is_refused_with_its_new_spelling(capsys, argv, named):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert named in capsys.readouterr().err


def test_a_section_given_a_value_names_its_settings(capsys):
    with pytest.raises(
        SettingsError, match=r"--model holds settings: set one, e\.g\. --model\.name"
    ):
        _run_config("--model", "x")


def _stage_default_sections() -> list[tuple[type, str]]:
    """(config class, field) wherever a config's nested section differs from its class's own
    defaults: RL's reward weights, DPO's learning rate, an evaluation's temperature..."""
    from codepost.pipeline.stages.registry import STAGES

    found = []
    for config in {stage.config for stage in STAGES.values()} | {EvalConfig, PostTrainConfig}:
        for name, field in config.model_fields.items():
            try:
                default = field.get_default(call_default_factory=True)
            except ValueError:  # computed from other fields
                continue
            if isinstance(default, BaseModel) and default != type(default)():
                found.append((config, name))
    return found


def test_a_section_given_in_part_keeps_the_rest_at_the_enclosing_config_s_defaults():
    """The red team's case: ``scoring: {sandbox: ...}`` alone set RL's format and syntax
    weights to ScoreConfig's 0."""
    from codepost.pipeline.stages.rl import RLConfig

    sections = _stage_default_sections()
    assert (RLConfig, "scoring") in sections and len(sections) >= 10
    for config, name in sections:
        assert getattr(config.model_validate({name: {}}), name) == getattr(config(), name), name
    run = PostTrainConfig.model_validate(
        {"stages": [{"stage": "rl", "config": {"scoring": {"sandbox": {"cpus": 0.5}}}}]}
    )
    rl = run.stages[0].config
    assert rl.scoring.sandbox.cpus == 0.5
    assert rl.scoring.reward.weights == RLConfig().scoring.reward.weights != {"test": 1.0}
    deeper = RLConfig.model_validate({"scoring": {"reward": {"test_reward": "pass_fraction"}}})
    assert deeper.scoring.reward.weights == RLConfig().scoring.reward.weights
    assert RLConfig.model_validate(
        {"problems": {"limit": 5}}
    ).problems == RLConfig().problems.model_copy(update={"limit": 5})


def test_a_section_that_names_another_thing_starts_from_its_own_defaults():
    from codepost.pipeline.data.problem_sets import ProblemSet
    from codepost.pipeline.stages.rl import RLConfig

    assert RLConfig().problems.split == "train"  # MBPP's training split
    assert RLConfig.model_validate({"problems": {"source": "humaneval"}}).problems == ProblemSet()
    # a choice among classes is taken as given: PPO's estimator, not GRPO's with PPO's name
    ppo = RLConfig.model_validate({"update": {"algorithm": "ppo"}}).update
    assert (
        isinstance(ppo.advantage, GAEParams)
        and ppo.mask_truncated == RLConfig().update.mask_truncated
    )


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The config classes an annotation holds (in a list, a mapping, a union of stages...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _seed_fields(model: type[BaseModel], seen: set[type]) -> list[tuple[str, FieldInfo]]:
    """(class.field, its info) of every field named *seed at any depth of ``model``."""
    if model in seen:
        return []
    seen.add(model)
    found = [
        (f"{model.__name__}.{n}", f) for n, f in model.model_fields.items() if n.endswith("seed")
    ]
    for field in model.model_fields.values():
        for inner in _models_in(field.annotation):
            found += _seed_fields(inner, seen)
    return found


def test_every_seed_is_a_seed_libraries_take():
    """numpy and torch take seeds up to 2**32 - 1: past it a run failed in set_seed, inside its
    first stage after the base evaluation."""
    from codepost.pipeline.inference.server import SampleServerConfig

    seeds = _seed_fields(PostTrainConfig, set()) + _seed_fields(SampleServerConfig, set())
    assert len(seeds) >= 10, seeds
    for name, field in seeds:
        seed = TypeAdapter(
            Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        )
        assert seed.validate_python(2**32 - 1) == 2**32 - 1, name
        for value in (-1, 2**32):
            with pytest.raises(ValidationError):
                seed.validate_python(value)
    with pytest.raises(SettingsError, match=r"^--seed 4294967296: Input should be less than"):
        _run_config("--seed", "4294967296")
    with pytest.raises(SettingsError, match=r"--stages\.rl\.sampling\.seed -1: Input should be"):
        _run_config("--stages.rl.sampling.seed", "-1")
    assert _run_config("--seed", str(2**32 - 1)).seed == 2**32 - 1


def test_a_yaml_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 1\nstages:\n  - stage: rl\n    config:\n      iterations: 2\n"
                    "      sampling: {max_tokens: 64}\n      iterations: 3\n")  # fmt: skip
    with pytest.raises(SettingsError) as refused:
        load_config(PostTrainConfig, path, [])
    assert str(refused.value) == f"{path}: 'iterations' is given twice, on lines 5 and 7"
    merged = tmp_path / "merge.yaml"  # a YAML merge key overrides by design: not a repeat
    merged.write_text("base: &b {seed: 1}\nrun: {<<: *b, seed: 2}\n")
    from codepost.settings.config import read_settings

    assert read_settings(merged, "x")["run"] == {"seed": 2}


def test_a_flag_into_a_mapping_entry_the_config_lacks_is_refused_with_the_keys_there_are():
    """A misspelt benchmark (``--evaluations.humaneavl...``) added a whole 164-problem one."""
    with pytest.raises(SettingsError) as refused:
        _run_config("--evaluations.humaneavl.sampling.max-tokens", "5")
    assert str(refused.value) == (
        "--evaluations.humaneavl.sampling.max-tokens: --evaluations has no entry 'humaneavl' "
        "(it has humaneval); did you mean --evaluations.humaneval.sampling.max-tokens? A new "
        "entry is given whole: --evaluations.humaneavl '{...}'"
    )
    # given whole, a new entry is added: a benchmark, a reward term
    added = _run_config(
        "--evaluations.mbpp", "{problems: {source: mbpp, split: test, limit: 5}}",
        "--evaluations.mbpp.sampling.max-tokens", "64",
        "--stages.rl.scoring.reward.weights.length", "0.5",
    )  # fmt: skip
    assert set(added.evaluations) == {"humaneval", "mbpp"}
    assert added.evaluations["mbpp"].problems.limit == 5
    assert added.evaluations["mbpp"].sampling.max_tokens == 64
    assert added.entry("rl").config.scoring.reward.weights["length"] == 0.5


def test_a_bad_value_is_one_line_naming_the_flag_or_the_key_its_line_and_the_value(tmp_path):
    with pytest.raises(SettingsError) as refused:
        _run_config("--stages.rl.iterations", "0")
    assert str(refused.value) == (
        "--stages.rl.iterations 0: Input should be greater than or equal to 1"
    )
    path = tmp_path / "run.yaml"
    path.write_text("stages:\n  - sft\n  - stage: rl\n    config:\n      iterations: 0\n"
                    "      updte: {learning_rate: 1.0e-6}\n")  # fmt: skip
    with pytest.raises(SettingsError) as refused:
        load_config(PostTrainConfig, path, [])
    assert str(refused.value).splitlines() == [
        f"{path}, line 5: stages[1].config.iterations = 0: Input should be greater than or "
        "equal to 1",
        f"{path}, line 6: stages[1].config.updte: RLConfig has no such setting; did you mean "
        "update?",
    ]
    # a section's own error names where the section is written, not a flag set inside it
    path.write_text("stages:\n  - sft\n  - stage: rl\n    config: {sampling: {temperature: 0}}\n")
    with pytest.raises(SettingsError) as refused:
        load_config(
            PostTrainConfig,
            path,
            split_settings(["--stages.rl.iterations", "2"], PostTrainConfig)[0],
        )
    assert str(refused.value).startswith(
        f"{path}, line 4: stages[1].config: sampling.temperature=0 samples greedily"
    )


def test_print_config_prints_every_setting_as_yaml_that_loads_back(tmp_path, capsys):
    assert cli.main(["run", "--print-config", "--stages.rl.iterations", "7"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "printed.yaml"
    path.write_text(printed)
    config = load_config(PostTrainConfig, path, [])
    assert config == _run_config("--stages.rl.iterations", "7")
    assert yaml.safe_load(printed)["stages"][2]["config"]["update"]["learning_rate"] == 2e-6


def test_a_command_reads_its_config_without_the_ml_stack_or_prefect():
    """The flags of `codepost run` are read, --help written and a misspelt one refused before
    torch, transformers, TRL or Prefect load: a second, where they took 14-60 s."""
    loaded, err = _commands_load(
        ["run", "--help"],
        ["run", "--help-all"],
        ["evaluate", "--help"],
        ["run", "--stages.rl.update.learnig-rate", "1"],
        ["run", "--print-config"],
    )
    assert loaded == []
    assert "did you mean learning_rate" in err


def test_every_config_validates_against_its_own_json_schema():
    """Prefect's form is drawn from a config's JSON schema and a deployment's parameters are
    checked against it on the server: a schema that refuses the config's own values (a reward
    term's settings, typed by a base with no field) failed every deployment of `codepost
    serve`."""
    params = {"length": {"budget": 10}, "format": {"require_think": True}}
    tuned = RewardConfig(weights={"test": 1.0, "length": 0.5}, params=params)
    configs = [embedded_default(), NightlyConfig(), tuned]
    for config in configs:
        jsonschema.validate(config.model_dump(mode="json"), type(config).model_json_schema())
    with pytest.raises(jsonschema.ValidationError, match="bugdet"):
        wrong = {**tuned.model_dump(mode="json"), "params": {"length": {"bugdet": 10}}}
        jsonschema.validate(wrong, RewardConfig.model_json_schema())
