"""Results people can trust: the fingerprint every evaluation carries and the checks that compare them
(``fingerprint``, ``comparisons``), the standard suite (``suite``), the grounding probes (``probes``) and the metrics
they add (``metrics``). docs/evaluation.md says how to report results that others can compare."""
