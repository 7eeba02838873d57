"""Published checkpoints: model folders with a manifest, and the registry of a run folder."""
