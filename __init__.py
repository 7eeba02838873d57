"""codepost: code post-training with a sandboxed verifier.

One import namespace over the design card's folders, mapped in ``pyproject.toml``:
``codepost.sandbox`` (isolated execution), ``codepost.verifiers`` (verdicts and rewards),
``codepost.pipeline`` (the ML stages), ``codepost.flows`` (Prefect and the ``codepost``
command) and ``codepost.settings`` (the settings and command-line kit they all use).
Dependencies point one way: flows -> pipeline -> verifiers -> sandbox -> settings.
"""

__version__ = "0.1.0"
