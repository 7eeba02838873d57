"""C++: compiled once per job with g++ (C++17, -O2, linked statically, as competitive-programming
judges do), and the binary executed for each case.

``ONLINE_JUDGE`` is defined as Codeforces defines it: solutions written for it read a local
file instead of stdin without it. The main thread's stack may grow to the memory limit, as on
Codeforces (the runner sets it), so deep recursion works. ``<bits/stdc++.h>`` is precompiled
with the same flags when the image is built: a program that includes it first compiles in a
fifth of the time (GCC falls back to the header itself where the precompiled one does not
apply).
"""

from . import Language, register

FLAGS = ("-std=c++17", "-O2", "-pipe", "-DONLINE_JUDGE")
# The header's folder depends on the architecture and the GCC version: let the shell find it.
_PRECOMPILE = (
    "set -- /usr/include/*/c++/*/bits/stdc++.h && "
    f'g++ {" ".join(FLAGS)} -x c++-header -o "$1.gch" "$1"'
)

register(
    Language(
        name="cpp",
        source_file="main.cpp",
        title="C++",
        fences=("cpp", "c++", "cc", "cxx"),
        # -iquote .: `#include "x.h"` finds the job's files; -fmax-errors bounds the message;
        # -static: a case starts in 0.6 ms of CPU instead of 2.4 ms (no dynamic loading of
        # libstdc++), for 0.1 s more of linking once per job.
        compile=(
            "g++",
            *FLAGS,
            "-iquote",
            ".",
            "-fmax-errors=20",
            "-static",
            "-o",
            "{output}/main",
            "{source}",
        ),
        run=("{output}/main",),
        memory_errors=(
            "std::bad_alloc",  # new or a container failed to allocate: the program aborts
            "virtual memory exhausted",  # the compiler, out of memory
            "out of memory allocating",
            "PCH allocation failure",  # no room to map the precompiled header (~150 MB)
        ),
        checker=True,
        packages=("g++",),
        image_setup=(("sh", "-c", _PRECOMPILE),),
    )
)
