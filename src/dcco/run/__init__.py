"""A run's plumbing: planning its rounds (``rounds``), its state and step (``pretraining``),
the loop every backend shares (``loop``), run directories, checkpoints, metrics, progress,
reports, and the trained encoders they hold (``encoders``)."""
