"""Published checkpoints: model folders with a manifest, and the catalog of a run folder."""
