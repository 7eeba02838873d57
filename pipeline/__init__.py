"""The ML side of codepost, one folder per part:

- ``stages/``: one module per stage of a run (``run_...(config, paths)``): SFT, the difficulty
  filter, sampling and scoring, RL, pair mining, DPO, evaluation;
- ``rl/``: the RL core: estimators and losses over masks, rollout batches, the policy update;
- ``inference/``: the samplers (vLLM, transformers) and vLLM's in-place weight refresh;
- ``data/``: problem sets and the prompts built from them;
- ``checkpoints/``: published model folders with manifests, and a run folder's registry;
- ``reporting/``: intervals and paired tests, the run's report, plots;
- at the top: the run config (``post_train``), model loading (``model_config``), the TRL
  trainers' shared settings (``training``), process-wide resources and the CLI.
"""
