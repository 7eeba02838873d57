"""C++ in the Docker sandbox, for real: the compile phase (once per job, its own limits, its own
status), the binary's runs under the same limits as Python's, and what a job leaves behind.
The hostile programs are in the red-team suite (``CPP_ATTACKS`` in redteam_cpp.py)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from codepost.sandbox import ExecStatus, ExecutionResult, Job, Limits

pytestmark = pytest.mark.docker

LIMITS = Limits(
    wall_time_s=3.0,
    cpu_time_s=3.0,
    memory_mb=256,
    output_bytes=64_000,
    disk_mb=16,
    compile_time_s=20.0,  # this machine is shared: an honest compile must never time out here
)
HEADER = (
    "#include <bits/stdc++.h>\n#include <sys/stat.h>\n#include <unistd.h>\nusing namespace std;\n"
)
SQUARE = HEADER + "int main() { long long n; cin >> n; cout << n * n << '\\n'; }\n"


def run(pool, program: str, *stdin: str, limits: Limits = LIMITS, **job: object) -> ExecutionResult:
    return pool.run(
        Job(program=program, stdin_cases=stdin or ("",), limits=limits, language="cpp", **job)
    )


def test_a_job_compiles_once_and_runs_every_case_from_the_same_binary(sandbox_pool):
    """Each case prints its answer and the identity of the file it runs from: one compile
    means one file (a compile per case would make a new one each time)."""
    program = HEADER + (
        "int main() {\n"
        "  long long n; cin >> n;\n"
        '  struct stat s; stat("/proc/self/exe", &s);\n'
        "  cout << n * n << ' ' << s.st_ino << ' ' << s.st_mtim.tv_nsec << '\\n';\n"
        "}\n"
    )
    cases = [f"{n}\n" for n in range(30)]
    result = run(sandbox_pool, program, *cases)
    assert result.status is ExecStatus.COMPLETED, result
    assert result.compile is not None and result.compile.status is ExecStatus.COMPLETED
    assert result.compile.exit_code == 0
    answers = [case.stdout.split() for case in result.cases]
    assert [int(a[0]) for a in answers] == [n * n for n in range(30)]
    assert len({tuple(a[1:]) for a in answers}) == 1, answers


def test_a_program_that_does_not_compile_is_a_compile_error_with_the_compilers_message(
    sandbox_pool,
):
    result = run(sandbox_pool, "int main() { return undeclared; }\n", "1\n", "2\n")
    assert result.status is ExecStatus.COMPILE_ERROR and result.cases == ()
    assert result.compile.status is ExecStatus.COMPILE_ERROR and result.compile.exit_code == 1
    assert "main.cpp:1:21: error: 'undeclared' was not declared" in result.compile.stderr.replace(
        "\u2018", "'"
    ).replace("\u2019", "'")
    assert result.error.startswith("did not compile: ") and "undeclared" in result.error


def test_the_compilers_message_is_clipped(sandbox_pool):
    program = "int main() {\n" + "".join(f"  undeclared_{n}();\n" for n in range(200)) + "}\n"
    result = run(sandbox_pool, program)
    assert result.status is ExecStatus.COMPILE_ERROR
    assert 2000 < len(result.compile.stderr.encode()) <= 4096


# Each loop is within GCC's constexpr loop limit (262,144), their product far within its
# operation limit (2^33): the compiler evaluates 4e10 steps unless something stops it.
CONSTEXPR_SPIN = """
constexpr long long spin() {
  long long s = 0;
  for (int i = 0; i < 200000; i++)
    for (int j = 0; j < 200000; j++) s += i ^ j;
  return s;
}
constexpr long long value = spin();
int main() { return value == 1; }
"""


@pytest.mark.parametrize(
    ("program", "limits", "status"),
    [
        (CONSTEXPR_SPIN, dataclasses.replace(LIMITS, compile_time_s=2.0), ExecStatus.TIMEOUT),
        (SQUARE, dataclasses.replace(LIMITS, compile_memory_mb=48), ExecStatus.MEMORY_LIMIT),
        (  # 32 MB of initialised data: over the job's 16 MB file size limit
            "char data[32 << 20] = {1};\nint main() { return data[7]; }\n",
            LIMITS,
            ExecStatus.COMPILE_ERROR,
        ),
    ],
    ids=["time", "memory", "binary_size"],
)
def test_the_compile_has_its_own_limits(sandbox_pool, program, limits, status):
    started = time.monotonic()
    result = run(sandbox_pool, program, "", limits=limits)
    took = time.monotonic() - started
    assert result.status is ExecStatus.COMPILE_ERROR and result.cases == (), result
    assert result.compile.status is status, result.compile
    assert took < limits.compile_time_s * 3 + 5, took  # the stretch for a busy host, then start-up


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("while (true) {}", ExecStatus.TIMEOUT),
        ("sleep(100);", ExecStatus.TIMEOUT),
        (
            "vector<vector<char>> v; while (true) v.emplace_back(1 << 20, 1);",
            ExecStatus.MEMORY_LIMIT,
        ),
        ("while (true) cout << string(10000, 'x');", ExecStatus.OUTPUT_LIMIT),
        ("int *p = nullptr; cout << *p;", ExecStatus.RUNTIME_ERROR),
        ("return 3;", ExecStatus.RUNTIME_ERROR),
        ("abort();", ExecStatus.RUNTIME_ERROR),
    ],
    ids=["cpu", "wall", "memory", "output", "segfault", "exit_3", "abort"],
)
def test_the_binary_runs_under_the_same_limits_as_python(sandbox_pool, body, status):
    started = time.monotonic()
    result = run(sandbox_pool, f"{HEADER}int main() {{ {body} }}\n", "")
    took = time.monotonic() - started
    (case,) = result.cases
    assert result.status is ExecStatus.COMPLETED and case.status is status, result
    assert took < result.compile.duration_s + LIMITS.wall_time_s * 3 + 3, took


def test_honest_programs_recurse_deeply_and_use_threads(sandbox_pool):
    program = HEADER + (
        "int depth(int n) { volatile char pad[64]; pad[0] = 1; return n ? 1 + depth(n - 1) : pad[0]; }\n"
        "int main() {\n"
        "  vector<thread> pool; atomic<int> done{0};\n"
        "  for (int i = 0; i < 8; i++) pool.emplace_back([&] { done++; });\n"
        "  for (auto &t : pool) t.join();\n"
        "  cout << depth(1000000) << ' ' << done << '\\n';\n"
        "}\n"
    )
    (case,) = run(sandbox_pool, program).cases
    assert (case.status, case.stdout) == (ExecStatus.COMPLETED, "1000001 8\n"), case


def test_the_jobs_files_reach_the_compiler_and_the_program(sandbox_pool):
    program = HEADER + (
        '#include "lib/values.h"\n'
        "int main() {\n"
        '  ifstream in("data.txt"); int x; in >> x;\n'
        "  ofstream(\"out.txt\") << x * SCALE << '\\n';\n"
        "  cout << x * SCALE << '\\n';\n"
        "}\n"
    )
    result = run(
        sandbox_pool,
        program,
        "",
        "",
        files={"lib/values.h": b"#define SCALE 3\n", "data.txt": b"14\n"},
        fetch_files=("out.txt",),
    )
    assert result.status is ExecStatus.COMPLETED, result
    assert [(c.stdout, c.files) for c in result.cases] == [("42\n", {"out.txt": b"42\n"})] * 2


def test_the_binary_cannot_be_changed_and_is_gone_after_the_job(sandbox_pool):
    """Case 1 tries to change its own binary (so that case 2 would run another program) and
    prints where it is; the next job looks for it."""
    program = HEADER + (
        "int main() {\n"
        '  char path[4096] = {0}; readlink("/proc/self/exe", path, sizeof path - 1);\n'
        "  int changed = 0;\n"
        "  changed += (bool)ofstream(path, ios::app);\n"
        "  changed += chmod(path, 0777) == 0;\n"
        "  changed += unlink(path) == 0;\n"
        "  string dir = string(path).substr(0, string(path).rfind('/'));\n"
        '  changed += rename(dir.c_str(), "/build/moved") == 0;\n'
        '  changed += chmod("/build", 0777) == 0;\n'
        '  changed += (bool)ofstream("/build/new");\n'
        "  cout << path << ' ' << changed << '\\n';\n"
        "}\n"
    )
    result = run(sandbox_pool, program, "", "")
    first, second = (case.stdout.split() for case in result.cases)
    assert first[0].startswith("/build/") and first == second, result
    assert first[1] == "0", "the program changed its binary or the build directory"
    probe = f"import os\nprint(os.path.exists({first[0]!r}), os.listdir('/work'))\n"
    after = [sandbox_pool.run(Job(program=probe, stdin_cases=("",))) for _ in range(4)]
    assert all(r.cases[0].stdout == "False []\n" for r in after), after


def test_the_compiler_runs_as_the_sandbox_user(sandbox_pool):
    """Root's files (the supervisor's environment) are out of the compiler's reach too."""
    result = run(sandbox_pool, '#include "/proc/1/environ"\nint main() {}\n')
    assert result.status is ExecStatus.COMPILE_ERROR
    assert "Permission denied" in result.compile.stderr, result.compile
