"""C++: native binaries under the same guarantees, attacks of every class in C++, a C++
leaver, and C++ against checkers."""

from __future__ import annotations

import textwrap

from redteam_checkers import SPLIT
from redteam_samples import (
    FAILED,
    MEMORY_LIMIT,
    NOT_PASSED,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    TIMEOUT,
    IoAttack,
)

from codepost.verifiers import Problem

# -- C++ (issue 25): native binaries under the same guarantees. Each program is a sample in C++
# (``language: cpp``) answering the io problem SQUARE ("read n, print n squared", stdin 7): an
# escape or a cheat that worked prints 49, and the suite asserts that nothing passes.

COMPILE_ERROR = "compile_error"

_CPP_HEADER = """
#include <bits/stdc++.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <sched.h>
#include <signal.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
using namespace std;

// The pids of every process but this one.
vector<int> others() {
  vector<int> pids;
  for (auto &entry : filesystem::directory_iterator("/proc")) {
    string name = entry.path().filename();
    if (all_of(name.begin(), name.end(), ::isdigit) && stoi(name) != getpid())
      pids.push_back(stoi(name));
  }
  return pids;
}
"""


def cpp(body: str) -> str:
    """A C++ program: the shared header (``<bits/stdc++.h>`` first, so it compiles from the
    precompiled header), then ``body``."""
    return _CPP_HEADER + textwrap.dedent(body)


CPP_HONEST = cpp("int main() { long long n; cin >> n; cout << n * n << endl; }\n")

CPP_ATTACKS = [
    # -- processes, memory, output, time
    IoAttack("cpp_fork_bomb", cpp("int main() { while (true) fork(); }"), frozenset({TIMEOUT})),
    IoAttack(
        "cpp_fork_bomb_of_spinners",
        cpp("int main() { while (true) if (fork() == 0) while (true) {} }"),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_thread_bomb_spinning",
        cpp("""
        int main() {
          vector<thread> spinners;
          for (int i = 0; i < 64; i++) {
            try { spinners.emplace_back([] { while (true) {} }); } catch (...) {}
          }
          while (true) {}
        }
        """),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_memory_bomb_new",
        cpp("""
        int main() {
          vector<char *> hog;
          while (true) { hog.push_back(new char[1 << 24]); memset(hog.back(), 1, 1 << 24); }
        }
        """),
        frozenset({MEMORY_LIMIT}),
    ),
    IoAttack(  # malloc's NULL written to: a crash, not a pass
        "cpp_memory_bomb_unchecked_malloc",
        cpp("int main() { while (true) memset(malloc(1 << 24), 1, 1 << 24); }"),
        frozenset({MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    IoAttack(  # each process within its address space, together over the container's memory
        "cpp_memory_bomb_across_processes",
        cpp("""
        int main() {
          for (int i = 0; i < 14; i++)
            if (fork() == 0) {
              char *hog = (char *)malloc(200 << 20);
              if (hog) memset(hog, 1, 200 << 20);
              sleep(30);
              _exit(0);
            }
          sleep(1);
        }
        """),
        NOT_PASSED | {MEMORY_LIMIT, TIMEOUT},
    ),
    IoAttack(  # static data over the memory limit: the kernel cannot load it
        "cpp_static_array_over_the_memory_limit",
        cpp("""
        static char hog[1 << 30];
        int main() { memset(hog, 1, sizeof hog); cout << 49 << endl; }
        """),
        frozenset({MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    IoAttack(
        "cpp_stack_overflow",
        cpp("""
        int down(int n) { volatile char pad[4096]; pad[0] = n; return down(n + 1) + pad[0]; }
        int main() { return down(0); }
        """),
        frozenset({RUNTIME_ERROR}),
    ),
    IoAttack(
        "cpp_stdout_flood",
        cpp("int main() { string x(10000, 'x'); while (true) cout << x << '\\n'; }"),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_stdout_flood_one_write",
        cpp("""
        int main() {
          size_t size = 100 << 20;
          char *x = (char *)malloc(size);
          memset(x, 'x', size);
          return write(1, x, size) < 0;
        }
        """),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_orphan_floods_after_exit",
        cpp("""
        int main() {
          if (fork() == 0) { string x(10000, 'x'); while (true) cout << x << endl; }
          long long n; cin >> n; cout << n * n << endl;
        }
        """),
        frozenset({OUTPUT_LIMIT}),
    ),
    IoAttack(
        "cpp_spin_ignoring_signals",
        cpp("""
        int main() {
          for (int sig : {SIGTERM, SIGXCPU, SIGINT, SIGHUP, SIGALRM}) signal(sig, SIG_IGN);
          while (true) {}
        }
        """),
        frozenset({TIMEOUT}),
    ),
    IoAttack(
        "cpp_sleep_forever", cpp("int main() { while (true) pause(); }"), frozenset({TIMEOUT})
    ),
    IoAttack("cpp_self_sigstop", cpp("int main() { raise(SIGSTOP); }"), frozenset({TIMEOUT})),
    IoAttack(
        "cpp_tmpfs_and_inodes_fill",
        cpp("""
        int main() {
          string chunk(1 << 20, 'x');
          for (string dir : {"/work", "/tmp", "/dev/shm"}) {
            for (int i = 0; i < 100; i++) {
              ofstream out(dir + "/fill" + to_string(i));
              for (int j = 0; j < 8 && out; j++) out << chunk;
              if (!out) break;
            }
            for (int i = 0; i < 100000 && mkdir((dir + "/d" + to_string(i)).c_str(), 0700) == 0; i++) {}
          }
        }
        """),
        NOT_PASSED,
    ),
    # -- signals: the supervisor, the zygote, the judge and other containers are out of reach
    IoAttack(
        "cpp_kill_everything",
        cpp("""
        int main() {
          for (int pid : others()) { kill(pid, SIGSTOP); kill(pid, SIGKILL); }
          for (int target : {1, getppid(), -1}) kill(target, SIGKILL);
        }
        """),
        frozenset({FAILED}),  # kill(-1) spares the caller: it ends, printing nothing
    ),
    IoAttack("cpp_self_sigkill", cpp("int main() { raise(SIGKILL); }"), frozenset({RUNTIME_ERROR})),
    IoAttack(
        "cpp_realtime_signal_death",
        cpp("int main() { signal(SIGRTMAX, SIG_DFL); raise(SIGRTMAX); }"),
        frozenset({RUNTIME_ERROR}),
    ),
    # -- escapes: each prints the right answer only if it worked
    IoAttack(
        "cpp_network_escape",
        cpp("""
        bool tcp(const char *host, int port) {
          int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
          sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(port);
          inet_pton(AF_INET, host, &a.sin_addr);
          connect(s, (sockaddr *)&a, sizeof a);
          usleep(100000);
          int error = 1; socklen_t length = sizeof error;
          getsockopt(s, SOL_SOCKET, SO_ERROR, &error, &length);
          bool ok = s >= 0 && error == 0 && send(s, "x", 1, MSG_NOSIGNAL) == 1;
          close(s);
          return ok;
        }
        int main() {
          bool escaped = false;
          for (auto [host, port] : vector<pair<const char *, int>>{
                   {"127.0.0.1", 22}, {"127.0.0.1", 2375}, {"172.17.0.1", 2375},
                   {"172.17.0.1", 80}, {"1.1.1.1", 53}, {"8.8.8.8", 53}, {"169.254.169.254", 80}})
            escaped |= tcp(host, port);
          int udp = socket(AF_INET, SOCK_DGRAM, 0);
          sockaddr_in dns{}; dns.sin_family = AF_INET; dns.sin_port = htons(53);
          inet_pton(AF_INET, "8.8.8.8", &dns.sin_addr);
          escaped |= sendto(udp, "x", 1, 0, (sockaddr *)&dns, sizeof dns) == 1;
          for (const char *path : {"/var/run/docker.sock", "/run/docker.sock",
                                   "/run/containerd/containerd.sock"}) {
            int s = socket(AF_UNIX, SOCK_STREAM, 0);
            sockaddr_un a{}; a.sun_family = AF_UNIX; strcpy(a.sun_path, path);
            escaped |= connect(s, (sockaddr *)&a, sizeof a) == 0;
          }
          cout << (escaped ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_write_outside_the_work_dirs",
        cpp("""
        int main() {
          int written = 0;
          vector<string> targets = {
              "/escape", "/etc/passwd", "/opt/codepost/runner/supervisor.py",
              "/opt/codepost/runner/languages/cpp.py", "/usr/bin/g++", "/usr/bin/python3",
              "/proc/1/oom_score_adj", "/proc/sys/kernel/core_pattern",
              "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/pids.max", "/build/escape"};
          glob_t headers;  // the precompiled header, read by every later compile
          glob("/usr/include/*/c++/*/bits/stdc++.h.gch", 0, nullptr, &headers);
          for (size_t i = 0; i < headers.gl_pathc; i++) targets.push_back(headers.gl_pathv[i]);
          for (auto &path : targets) written += (bool)ofstream(path, ios::app);
          for (const char *path : {"/", "/build", "/opt/codepost", "/usr/include"})
            written += chmod(path, 0777) == 0;
          written += symlink("/etc/passwd", "/build/link") == 0;
          cout << (written ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_read_other_users_memory_and_files",
        cpp("""
        int main() {
          int read_something = 0;
          for (int pid : others()) {
            for (string file : {"mem", "environ"}) {
              ifstream in("/proc/" + to_string(pid) + "/" + file, ios::binary);
              char c;
              read_something += in && in.get(c);
            }
            char byte; iovec local{&byte, 1}, remote{(void *)0x400000, 1};
            read_something += process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1;
          }
          for (const char *path : {"/etc/shadow", "/root", "/proc/kcore", "/dev/mem"})
            read_something += access(path, R_OK) == 0;
          cout << (read_something ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_ptrace_every_process",
        cpp("""
        int main() {
          int attached = 0;
          for (int pid : others()) {
            attached += ptrace(PTRACE_ATTACH, pid, nullptr, nullptr) == 0;
            attached += ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) == 0;
          }
          cout << (attached ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    IoAttack(
        "cpp_privilege_escalation",
        cpp("""
        int main() {
          int gained = 0;
          gained += setuid(0) == 0;
          gained += setgid(0) == 0;
          gained += seteuid(0) == 0;
          gained += chroot("/work") == 0;
          for (int flags : {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID}) {
            pid_t child = fork();
            if (child == 0) _exit(unshare(flags) == 0 ? 0 : 1);
            int status = 1;
            waitpid(child, &status, 0);
            gained += WIFEXITED(status) && WEXITSTATUS(status) == 0;
          }
          ifstream status("/proc/self/status");
          for (string line; getline(status, line);)
            if (line.rfind("CapEff:", 0) == 0) gained += line.find_first_not_of("0", 8) != string::npos;
          gained += geteuid() == 0;
          cout << (gained ? 49 : -1) << endl;
        }
        """),
        frozenset({FAILED}),
    ),
    # -- the compile phase: untrusted source, trusted compiler, the same isolation and limits
    IoAttack(
        "cpp_compile_include_dev_zero",
        '#include "/dev/zero"\nint main() {}\n',
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_include_itself",
        "#include __FILE__\nint main() {}\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_include_root_files",
        '#include "/proc/1/environ"\n#include "/proc/1/maps"\nint main() {}\n',
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_macro_explosion",
        "#define A0 x\n"
        + "".join(f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1}\n" for i in range(1, 20))
        + "int main() { A19; }\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_constexpr_spin",
        """
        constexpr long long spin() {
          long long s = 0;
          for (int i = 0; i < 200000; i++)
            for (int j = 0; j < 200000; j++) s += i ^ j;
          return s;
        }
        static_assert(spin() != 1);
        int main() {}
        """,
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_error_flood",
        # short names: the program stays under the verifier's completion limit (256 KiB)
        "int main() {\n" + "".join(f"e{n}();\n" for n in range(20000)) + "}\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
    IoAttack(
        "cpp_compile_binary_over_the_file_size_limit",
        "char data[256 << 20] = {1};\nint main() { return data[7]; }\n",
        frozenset({COMPILE_ERROR}),
        compile_time_s=3.0,
    ),
]

# Leaves everything it can in the container (the checker then looks, as after LEAVERS).
CPP_LEAVER = cpp("""
int main() {
  if (fork() == 0) {  // a double-forked daemon in its own session, deaf to signals
    setsid();
    if (fork() == 0) {
      for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGUSR1}) signal(sig, SIG_IGN);
      int listener = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(45679);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      bind(listener, (sockaddr *)&a, sizeof a);
      listen(listener, 1);
      while (true) { ofstream("/tmp/cpp-daemon-alive") << time(nullptr); usleep(10000); }
    }
    _exit(0);
  }
  if (fork() == 0) { raise(SIGSTOP); _exit(0); }
  for (string d : {"/work", "/tmp", "/dev/shm"}) {
    ofstream(d + "/plain") << "left";
    ofstream(d + "/.hidden") << "left";
    mkfifo((d + "/fifo").c_str(), 0600);
    symlink("/etc/passwd", (d + "/link").c_str());
    mkdir((d + "/locked").c_str(), 0700);
    ofstream(d + "/locked/file") << "left";
    chmod((d + "/locked").c_str(), 0);
  }
  int segment = shmget(0x5EC9, 4096, IPC_CREAT | 0600);
  if (segment >= 0) shmat(segment, nullptr, 0);
  usleep(600000);  // keep this container busy so the other one takes the twin job
  long long n; cin >> n; cout << n * n << endl;
}
""")


# -- C++ against checkers: the SPLIT problem judged by a testlib-style C++ checker (SPLIT_CPP,
# posed in C++), and the Python checker of SPLIT answered in C++. A cheat that worked makes the
# checker accept an answer that is not two positive integers summing to n.
SPLIT_CPP_CHECKER = """
#include <bits/stdc++.h>
using namespace std;
int main(int argc, char* argv[]) {  // testlib's order: input, contestant output, answer
  ifstream input(argv[1]), output(argv[2]);
  long long n, a, b;
  input >> n;
  if (!(output >> a >> b)) { cerr << "expected two integers"; return 2; }
  string extra;
  if (output >> extra) { cerr << "extra output"; return 2; }
  if (a < 1 || b < 1 || a + b != n) { cerr << "wrong answer"; return 1; }
}
"""
SPLIT_CPP = Problem(
    task_id="redteam/split-cpp",
    prompt=SPLIT.prompt,
    language="cpp",
    io=SPLIT.io,
    checker={"kind": "program", "language": "cpp", "source": SPLIT_CPP_CHECKER},
    canonical_solution=cpp("int main() { long long n; cin >> n; cout << 1 << ' ' << n - 1; }"),
)
CPP_CHECKED_HONEST = [
    cpp("int main() { long long n; cin >> n; cout << n - 1 << '\\n' << 1 << '\\n'; }"),
    cpp('int main() { long long n; cin >> n; printf("%lld %lld", n / 2, n - n / 2); }'),
]
CPP_CHECKER_ATTACKS = {
    # what a checker prints or exits with, printed by the program instead
    "prints_a_checkers_verdict": cpp(
        'int main() { cout << "1\\nok\\n"; cerr << "ok 1 number" << endl; return 0; }'
    ),
    # the checker's three files (and a checker binary) planted where it runs, kept rewritten by
    # a daemon in its own session deaf to signals, and the answer "0 0"
    "leaves_files_and_a_daemon_for_the_checker": cpp("""
        void plant() {
          const char *texts[][2] = {{"input.txt", "2\\n"}, {"output.txt", "1 1\\n"},
                                    {"answer.txt", "1 1\\n"}, {"expected.txt", "1 1\\n"},
                                    {"main", "#!/bin/sh\\nexit 0\\n"}};
          for (const char *folder : {"/work", "/tmp", "/dev/shm", "/tmp/build"})
            for (auto &text : texts) {
              string path = string(folder) + "/" + text[0];
              FILE *file = fopen(path.c_str(), "w");
              if (file) { fputs(text[1], file); fclose(file); chmod(path.c_str(), 0777); }
            }
        }
        int main() {
          plant();
          if (fork() == 0) {
            setsid();
            for (int sig : {SIGTERM, SIGHUP, SIGINT}) signal(sig, SIG_IGN);
            for (int i = 0; i < 400; i++) { plant(); usleep(25000); }
            _exit(0);
          }
          cout << "0 0" << endl;
        }
        """),
    # output framed as the checker job's own stdin (sizes, then texts), to shift what the
    # checker reads: it gets the output as one text, whatever it holds
    "output_framed_as_the_checkers_input": cpp('int main() { cout << "4\\n1 1\\n4\\n1 1\\n"; }'),
    # bytes no text holds: NULs, invalid UTF-8, a lone carriage return
    "output_with_nul_and_invalid_utf8": cpp(
        'int main() { fwrite("1\\0 1\\xff\\xfe\\r", 1, 8, stdout); }'
    ),
    "numbers_that_overflow_the_checkers_reads": cpp(
        'int main() { cout << "99999999999999999999 -99999999999999999997"; }'
    ),
    "kills_every_process_it_can_then_exits_0": cpp(
        "int main() { kill(-1, SIGKILL); for (int pid : others()) kill(pid, SIGKILL); }"
    ),
    "exits_0_with_nothing": cpp("int main() { return 0; }"),
}
