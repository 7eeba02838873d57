"""One registry class for every kind of plug-in: each is a ``Registry``, takes a name once, and
answers an unknown name naming the known ones."""

from __future__ import annotations

import pytest

from codepost.pipeline.rl.algorithms import ADVANTAGE_ESTIMATORS, ALGORITHMS, POLICY_LOSSES
from codepost.pipeline.stages import STAGES
from codepost.pipeline.tracking import TRACKERS
from codepost.settings.registry import Registry
from codepost.verifiers import environments, forms, schemas
from codepost.verifiers.rewards import REWARD_TERMS

REGISTRIES = {
    "stage": (STAGES, "rl"),
    "advantage estimator": (ADVANTAGE_ESTIMATORS, "grpo"),
    "policy loss": (POLICY_LOSSES, "vanilla"),
    "algorithm": (ALGORITHMS, "dapo"),
    "test form": (forms._FORMS, "io"),
    "record schema": (schemas._SCHEMAS, "codecontests"),
    "environment": (environments._ENVIRONMENTS, "execution-feedback"),
    "tracker": (TRACKERS, "tensorboard"),
    "reward term": (REWARD_TERMS, "format"),
}


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_every_kind_of_plug_in_is_one_registry_naming_the_known_on_a_miss(kind):
    registry, known = REGISTRIES[kind]
    assert isinstance(registry, Registry) and registry.kind == kind
    assert known in registry.all()
    with pytest.raises(ValueError, match=rf"unknown {kind} 'nope' \(known: .*{known}"):
        registry["nope"]


def test_a_name_registers_once():
    registry: Registry[int] = Registry("number")
    assert registry.register("one", 1) == 1
    assert registry.register("one", 1) == 1  # a module imported again registers it again
    with pytest.raises(ValueError, match="a number named 'one' is already registered"):
        registry.register("one", 2)
