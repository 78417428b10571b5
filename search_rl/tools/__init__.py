"""Command-line tools around a run: ``rollout_viewer``, ``plot_metrics``, ``diagnose``, ``print_config``,
``compare_evals``, ``best_checkpoint``, ``rft_rows`` and ``filter_prompts`` (sharing ``eval_records``)."""
