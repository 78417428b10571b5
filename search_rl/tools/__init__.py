"""Command-line tools around a run: ``rollout_viewer``, ``plot_metrics``, ``diagnose``, ``print_config``."""
