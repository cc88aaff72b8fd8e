"""gradstat theory layer: the closed forms of the five papers and the sparsity-inducing distributions with their
estimators. Pure functions; imports nothing of the project. Every public function cites its source (paper file
in ``shared/seeds`` and equation number)."""
