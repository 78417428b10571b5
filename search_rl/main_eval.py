"""Evaluation of a base model or a checkpoint on any parquet of Search-R1 rows, with the two baselines: greedy, or
``n_samples`` sampled answers per question (mean EM and pass@k: how much an RL policy could gain by sharpening).

    python -m search_rl.main_eval                                                # SmolLM2 with search, shipped test set
    python -m search_rl.main_eval model.path=runs/default/global_step_6/actor    # a trained checkpoint
    python -m search_rl.main_eval baseline=no_search                             # closed book, same model
    python -m search_rl.main_eval baseline=naive_rag rag_topk=3                  # top-3 passages inlined, no search
    python -m search_rl.main_eval 'data.files=[data/datasets/eval/bamboogle_test.parquet]' data.max_samples=50
    python -m search_rl.main_eval n_samples=8 actor_rollout_ref.rollout.temperature=1.0   # 8 samples per question

``search`` rolls out the rows' own prompts with the search loop; ``no_search`` and ``naive_rag`` rebuild the prompt
from the row's ``question`` with ``configs/templates/{no_search,naive_rag}.txt`` (``search_rl.templates``) and run one
answer turn. Same model, same greedy decoding, same scoring (``reward`` config). Writes ``metrics.json`` and
``trajectories.jsonl`` (the rollout-dump records of ``search_rl.tracking.rollout_dump``) under
``<output_dir>/<baseline>-<time>/``. The last line on stdout is ``eval n=<count> em=<x> subem=<y> f1=<z>`` over all
scored rows; per-source EM / sub-EM / F1, answer rate and searches per question are logged above it, with the search
diagnostics (``search_rl.reward.search_stats``: valid-search rate, duplicate queries, gold retrieved, wrong answers
split into no answer / no search / retrieval missed / read wrong, EM by number of searches, answer length). ``python -m
search_rl.tools.diagnose --eval <run>/metrics.json`` prints them as a table.

``metrics.json`` also holds tokens per question (``eval/<source>/model_tokens``, ``response_tokens``), the share of
answers copied from a passage shown (``answer_copy_rate``) and the run's ``fingerprint`` (``search_rl.evaluation``:
weights, template, budgets, retriever, data files, packages), which ``compare_evals`` checks (docs/evaluation.md).

With ``n_samples=k > 1`` every question is rolled out ``k`` times at ``actor_rollout_ref.rollout.temperature`` (top-p,
top-k likewise; seed ``actor_rollout_ref.rollout.seed``, 0 when unset): the EM, F1 and diagnostics are means over
all ``k`` samples, ``eval/<source>/pass@<k>`` is the share of questions with at least one exactly right, and the
result line adds ``samples=<k> pass@<k>=<x>``; ``n`` still counts questions.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from search_rl.config import CONFIG_DIR, ConfigError, exit_on_renamed, register_configs
from search_rl.configure import to_config
from search_rl.evaluation.run import EvalResult, evaluate, load_eval_config
from search_rl.rollout.backends import RetrieverError
from search_rl.rollout.backends.web import SearchBudgetExhausted

__all__ = ["EvalResult", "evaluate", "load_eval_config", "main"]

logger = logging.getLogger("search_rl.main_eval")


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base=None)
def main(composed: DictConfig) -> None:
    try:
        cfg = to_config(composed)
        result = evaluate(cfg)
    except (ConfigError, RetrieverError, FileNotFoundError, SearchBudgetExhausted) as e:
        logger.error("cannot evaluate: %s", e)
        sys.exit(2)
    logger.info("trajectories and metrics in %s", result.output_dir)
    sys.stdout.flush()
    sys.stdout.write(result.summary + "\n")  # the result line, last on stdout (scripts parse it)
    sys.stdout.flush()


register_configs()

if __name__ == "__main__":
    exit_on_renamed("eval", sys.argv[1:])
    main()
