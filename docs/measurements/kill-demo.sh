# Issue 9 items 2+3: the main command from a fresh clone, killed (kill -9) in the middle of an
# A record of the demo run for issue 9 (paths as on the development machine).
# RL iteration, then started again.
set -u
rm -rf /work/fresh && git clone -q /work/main /work/fresh && cd /work/fresh
OUT=/work/main/runs/measure/kill-demo; rm -rf $OUT; mkdir -p $OUT
start=$(date +%s)
bash scripts/run.sh > $OUT/leg1.log 2>&1 &
leg=$!
# wait for the first RL iteration to be published, then for the next one to be under way
until [ -f runs/post-train/rl/checkpoints/iteration-0001/manifest.json ]; do sleep 5; done
sleep 25
py=$(/work/main/.venv/bin/python - "$leg" <<'PY'
import sys, psutil
root = psutil.Process(int(sys.argv[1]))
for p in [root, *root.children(recursive=True)]:
    if "bin/codepost run" in " ".join(p.cmdline()):
        print(p.pid); break
PY
)
/work/main/.venv/bin/python - "$py" > $OUT/tree-before-kill.txt <<'PY'
import sys, psutil
root = psutil.Process(int(sys.argv[1]))
for p in [root, *root.children(recursive=True)]:
    print(p.pid, p.ppid(), " ".join(p.cmdline())[:120])
PY
ls runs/post-train/rl/checkpoints > $OUT/checkpoints-before-kill.txt
cat runs/post-train/rl/metrics.jsonl | wc -l > $OUT/metrics-lines-before-kill.txt
find runs/post-train -name evaluation.json -o -name manifest.json | sort | xargs sha256sum > $OUT/hashes-before-kill.txt
echo "kill -9 $py at $(date +%T), $(( $(date +%s) - start )) s after start" | tee $OUT/kill.txt
kill -9 $py
wait $leg; echo "leg 1 exit: $?" >> $OUT/kill.txt
sleep 10
/work/main/.venv/bin/python - $OUT/tree-before-kill.txt > $OUT/alive-after-kill.txt <<'PY'
import sys, psutil
for line in open(sys.argv[1]):
    pid = int(line.split()[0])
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    print(pid, "ALIVE" if alive else "gone", line.split(None, 2)[2].strip()[:80])
PY
ls runs/post-train/rl/ runs/post-train/rl/checkpoints > $OUT/after-kill-ls.txt 2>&1
start2=$(date +%s)
/usr/bin/time -v bash scripts/run.sh > $OUT/leg2.log 2>&1
echo "leg 2 exit: $? in $(( $(date +%s) - start2 )) s; total $(( $(date +%s) - start )) s" | tee -a $OUT/kill.txt
sha256sum -c $OUT/hashes-before-kill.txt > $OUT/hashes-after-resume.txt 2>&1
.venv/bin/codepost checkpoints --root runs/post-train list > $OUT/checkpoints-list.txt 2>&1
.venv/bin/codepost checkpoints --root runs/post-train verify > $OUT/checkpoints-verify.txt 2>&1; echo "verify exit $?" >> $OUT/checkpoints-verify.txt
