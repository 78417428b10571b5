"""The README's first command (``make demo``, ``python -m search_rl.demo``): the Search-R1 recipe in small, from the
shipped data to a policy that searches better than the model it started from. An entry point package: it drives the
other entry points (``main_sft``, ``main_ppo``, ``main_eval``) and nothing outside it imports it.

Its rooms:

- ``cli.py``: the command line (``main``, whose help is the journey) and the journey itself (``run_demo``).
- ``settings.py``: the run's knobs (``DemoSettings``), the per-turn budget, the stages, the shipped data it reads.
- ``budgets.py``: the run folder's ``budgets.json``, which makes reusing a folder safe.
- ``overrides.py``: the Hydra overrides of each stage (warm start, RL, evaluation), sharing one search loop.
- ``stages.py``: training and evaluating a stage in process, reusing what an earlier run left.
- ``retriever.py``: the retriever child process (started, shown, stopped whatever happens) and ``--serve-only``.
- ``progress.py``: the progress bars of a training stage and of the retriever's index build.
- ``results.py``: the plots, ``results.md`` and the closing summary.
"""
