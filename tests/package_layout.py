"""The package's folders at the repository's root, lowest layer first: each may import only
those before it (tests/test_layering.py), and together they are what a wheel ships."""

LAYERS = ("settings", "sandbox", "verifiers", "pipeline", "flows")
