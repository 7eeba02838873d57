"""The floor every layer stands on: the settings base and its YAML and dotted flags
(:mod:`.config`), the command-line kit (:mod:`.command_line`), the walk that finds settings of
one kind anywhere in a config (:mod:`.walk`) and the registry of named plug-ins
(:mod:`.registry`). ``sandbox``, ``verifiers``, ``pipeline`` and ``flows`` may all import it;
it imports none of them (the in-container runner imports nothing of codepost at all)."""
