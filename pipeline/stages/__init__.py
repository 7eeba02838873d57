"""The stages of a post-training run, one module each: ``run_...(config, paths)``."""
