"""Python: the program runs in a process forked from the runner's own interpreter (the
zygote), as ``python3 program.py`` would run it; it needs no preparing and no new process
image, and it is the one language a judge can call into. The image's own interpreter runs it:
no package to install."""

from . import Language, register

register(
    Language(
        name="python",
        source_file="main.py",
        title="Python",
        # "" too: an untagged block is Python's, as models most often leave it untagged
        fences=("python", "py", "python3", "py3", ""),
        memory_errors=("MemoryError",),
        checker=True,
    )
)
