"""The training loop shared by PPO and SFT, and what it is made of.

- ``loop.py``: ``TrainingLoop`` (fit, validate, save, resume), the one loop of every trainer.
- ``ppo.py``: ``PPOStep``, the learn half of an RL step (log-probs, values, advantages, updates, weight sync).
- ``sft.py``: ``SFTStep``, the supervised step of the warm start.
- ``collect.py``: the collectors handed to ``PPOStep``: ``SyncCollector`` (lock-step rollouts, dynamic sampling)
  and ``AsyncCollector`` (the asynchronous modes' generators); scoring and collation.
- ``steps.py``: the pure functions of one step; ``dynamic_sampling.py``: DAPO's group filter;
  ``checkpoint.py``: checkpoint folders.
"""
