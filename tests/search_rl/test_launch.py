"""The entry points' shared ``main`` body: a setup error and a retriever outage each end the run with one line and
their own exit code, not a traceback.

Run: python -m pytest tests/search_rl/test_launch.py -q
"""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from search_rl.config import ConfigError
from search_rl.launch import run_main
from search_rl.trainer.collect import RetrieverOutage

LOGGER = logging.getLogger("test_launch")


def _composed():
    from search_rl.configure import load_config

    return OmegaConf.structured(load_config(["model=tiny", "do_search=false"]))


def _outage(cfg, prepared):
    raise RetrieverOutage("step 3: 8 of 8 searches failed (retriever errors)")


def _setup_error(cfg, raw):
    raise ConfigError("data.train_files: nothing at missing.parquet")


def test_a_retriever_outage_exits_3_with_one_line(caplog):
    with caplog.at_level(logging.ERROR, logger="test_launch"), pytest.raises(SystemExit) as exit_info:
        run_main(_composed(), lambda cfg, raw: None, _outage, "training", LOGGER)
    assert exit_info.value.code == 3
    (record,) = [r for r in caplog.records if r.name == "test_launch"]
    assert record.getMessage() == "stopped training: step 3: 8 of 8 searches failed (retriever errors)"
    assert record.exc_info is None


def test_a_setup_error_exits_2(caplog):
    with caplog.at_level(logging.ERROR, logger="test_launch"), pytest.raises(SystemExit) as exit_info:
        run_main(_composed(), _setup_error, _outage, "training", LOGGER)
    assert exit_info.value.code == 2
    assert "cannot start training: data.train_files" in caplog.text
