"""Sampling engines: vLLM (with the in-place weight refresh) and transformers."""
