"""Rollout config: every field checked at construction, budgets cross-checked against the context length.

Run: python -m pytest tests/search_rl/config/test_config.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from search_rl.config import HFEngineConfig, RetrieverClientConfig, RolloutConfig


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_turn_tokens": 0}, "rollout.max_turn_tokens must be >= 1"),
        ({"search_turns": -1}, "rollout.search_turns must be >= 0"),
        ({"max_turn_tokens": 600, "max_response_tokens": 500}, "max_turn_tokens=600 exceeds"),
        ({"max_obs_tokens": 8}, "max_obs_tokens=8 is too small"),
        ({"prompt_truncation": "right"}, "prompt_truncation must be 'error' or 'left'"),
        ({"on_retriever_error": "ignore"}, "on_retriever_error must be 'raise' or 'observe'"),
    ],
)
def test_rollout_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**kwargs)


def test_validate_against_context():
    RolloutConfig(max_prompt_tokens=1024, max_response_tokens=1024).validate(2048)
    with pytest.raises(ValueError, match="= 2049 exceeds the model's context of 2048"):
        RolloutConfig(max_prompt_tokens=1025, max_response_tokens=1024).validate(2048)


def test_every_field_has_an_attribute_docstring():
    """Each field is documented once, under the field (the docs page and the trainer's YAML rely on it)."""
    import ast
    import inspect

    for cls in (RolloutConfig, RetrieverClientConfig, HFEngineConfig):
        tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
        documented = {
            a.target.id
            for a, nxt in zip(node.body, node.body[1:], strict=False)
            if isinstance(a, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        }
        assert {f.name for f in dataclasses.fields(cls)} <= documented, cls.__name__


def test_configs_are_omegaconf_structured():
    """The trainer registers these dataclasses in Hydra's ConfigStore: they must convert both ways."""
    from omegaconf import OmegaConf

    for cls in (RolloutConfig, RetrieverClientConfig, HFEngineConfig):
        assert isinstance(OmegaConf.to_object(OmegaConf.structured(cls)), cls)
    merged = OmegaConf.merge(OmegaConf.structured(RolloutConfig), {"search_turns": 2, "on_retriever_error": "observe"})
    assert OmegaConf.to_object(merged).search_turns == 2
