"""Training that produces gradients: the built-in workloads (:mod:`~gradstat.analysis.training.workloads`), the
:class:`~gradstat.analysis.training.recorder.Recorder` that writes them into a dump, and simulated data parallelism
(:mod:`~gradstat.analysis.training.parallel`)."""
