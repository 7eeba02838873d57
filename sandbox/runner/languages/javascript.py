"""JavaScript: the program's source run by Node.js (Debian's ``nodejs``, Node 18), as
``node main.js``, reading stdin and writing stdout as contest judges run it.

V8 holds its heap to the job's memory limit (``--max-old-space-size``): a program past it
ends with V8's "JavaScript heap out of memory", a ``memory_limit``. V8 also reserves address
space it never uses (its code range alone is 128 MB; a Node process maps 300 MB before the
program's first line, and did not start under 256 MB), so it may map ``reserved_mb`` more than
the limit. With 384 MB, buffers outside the heap reached the limit and 128 MB more in the
sandbox; with 256 MB, what the program holds, heap and buffers, stays within the limit. The
container's memory limit binds what it really uses in any case. The stack may grow to 64 MB (``--stack-size``, under the lifted stack
limit every non-Python program gets), so deep recursion works as in C++; V8's own worker
threads are none (``--v8-pool-size=0``): each would reserve a stack and a share of the cores.
"""

from . import Language, register

register(
    Language(
        name="javascript",
        source_file="main.js",
        title="JavaScript",
        fences=("javascript", "js", "node", "nodejs"),
        run=(
            "node",
            "--max-old-space-size={memory_mb}",
            "--stack-size=65500",
            "--v8-pool-size=0",
            "{source}",
        ),
        memory_errors=(
            "JavaScript heap out of memory",
            "Fatal process out of memory",  # a reservation refused: the address space is spent
            "std::bad_alloc",
        ),
        reserved_mb=256,
        packages=("nodejs",),
    )
)
