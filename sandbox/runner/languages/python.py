"""Python: the program runs in a process forked from the runner's own interpreter (the
zygote), as ``python3 program.py`` would run it; it needs no preparing and no new process
image, and it is the one language a judge can call into."""

from . import Language, register

register(Language(name="python", source_file="main.py", memory_errors=("MemoryError",)))
