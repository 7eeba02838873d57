"""The main-job benchmark's log reading: each phase from the lines a run writes."""

from __future__ import annotations

from benchmark_scripts import load

bench = load("main_job")

LOG = """\
23:58:00 INFO codepost.progress: [1/4] base/humaneval: started (run 0s)
23:58:10 INFO prefect.task_runs: (MainProcess pid=1) INFO [api_utils.py:286] non-default args: {}
23:58:50 INFO prefect.task_runs: (EngineCore pid=2) INFO [core.py:402] init engine (profile) took 2 s
00:01:00 INFO codepost.progress: sampling: 164/164 in 2m 05s
00:01:05 INFO codepost.progress: scoring greedy: 164/164 in 5s
00:01:05 INFO codepost.progress: [1/4] base/humaneval: done in 3m 05s (run 3m 05s)
00:05:00 INFO codepost.progress: sft: training steps: 4/4 in 3m 30s
00:09:00 INFO prefect.task_runs: iteration 1/3: reward 0.000, time/sample_s 30.0, time/score_s 4.0, time/update_s 120.5, time/save_s 3.5, time/refresh_s 1.0
00:10:00 INFO codepost.progress: [4/4] rl: done in 5m (run 12m)
"""


def test_phases_are_read_from_the_runs_own_lines_across_midnight(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    wall, phases = bench.phases(log)
    assert wall == 12 * 60
    assert phases == {
        "engines": 40 + 1.0,
        "generation": 125,
        "scoring": 5,
        "training": 210 + 120.5,
        "publishing": 3.5,
    }
