"""An io problem judged by a checker program: honest answers, and answers that try to make the
checker accept what it should not."""

from __future__ import annotations

from redteam_samples import (
    program,
)

from codepost.verifiers import IOCase, Problem

# -- an io problem judged by a checker program (many right answers); its job runs after the
# program's, in a swept container, so nothing the program leaves can reach it.
SPLIT_CHECKER = """
import sys

n = int(open(sys.argv[1]).read())
tokens = open(sys.argv[3]).read().split()
ok = (
    len(tokens) == 2
    and all(token.isdigit() for token in tokens)
    and int(tokens[0]) > 0
    and int(tokens[1]) > 0
    and int(tokens[0]) + int(tokens[1]) == n
)
sys.exit(0 if ok else 1)
"""
SPLIT = Problem(
    task_id="redteam/split",
    prompt="Read n (n >= 2). Print two positive integers whose sum is n.",
    io=tuple(IOCase(input=f"{n}\n", output=f"1 {n - 1}\n") for n in (2, 7, 100)),
    checker={"kind": "program", "source": SPLIT_CHECKER},
    canonical_solution="n = int(input())\nprint(1, n - 1)\n",
)
CHECKED_HONEST = [
    "n = int(input())\nprint(n - 1, 1)\n",
    "n = int(input())\nprint(n // 2, n - n // 2)\n",
]
CHECKER_ATTACKS = {
    "prints_the_score_a_checker_would": "print(1)\nprint('ok')\n",
    "leaves_files_and_a_process_for_the_checker": program("""
        import os
        import time

        def plant():
            for name, text in (
                ("output.txt", "1 1\\n"),
                ("input.txt", "2\\n"),
                ("expected.txt", "1 1\\n"),
                ("checker.py", "import sys\\nsys.exit(0)\\n"),
            ):
                for folder in ("/work", "/tmp", "/dev/shm"):
                    try:
                        with open(os.path.join(folder, name), "w") as stream:
                            stream.write(text)
                    except OSError:
                        pass

        plant()
        if os.fork() == 0:
            os.setsid()
            for _ in range(200):
                plant()
                time.sleep(0.05)
            os._exit(0)
        print(0, 0)
        """),
    "answers_that_break_the_checker": "print('1e999 -1e999')\n",
    "exits_0_with_nothing": "import os\nos._exit(0)\n",
}
