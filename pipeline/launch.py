"""One registered stage in the current process group: the ``accelerate launch`` entry.

::

    accelerate launch --num_processes N -m codepost.pipeline.launch STAGE \\
        --config config.json [--inputs inputs.json] --out-root D

``config.json`` is the stage's config (its pydantic model as JSON), ``inputs.json`` an
:class:`~.stages.registry.Artifacts` object. The stage runs under the resume rule of
:func:`~.stages.registry.run_stage` into ``D/<key>/``, exactly as ``codepost run`` lays it out.
Every rank runs the stage's code (the update and SFT share each batch among the ranks); only the
main process writes files (the checkpoint, its manifest, the resume record) while the others
wait at a barrier. The main process prints the outputs as JSON on stdout. Without
``accelerate launch`` it is one process, as ``codepost run`` would run the stage.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import parse_flag_from_env

from .stages import Artifacts, get_stage, run_stage

log = logging.getLogger("codepost.launch")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m codepost.pipeline.launch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("stage", help="a registered stage (e.g. update, sft)")
    parser.add_argument("--config", type=Path, required=True, help="the stage's config as JSON")
    parser.add_argument("--inputs", type=Path, help="an Artifacts object as JSON (default: none)")
    parser.add_argument("--out-root", type=Path, required=True, help="the stage's output root")
    args = parser.parse_args(argv)

    stage = get_stage(args.stage)
    # `accelerate launch --cpu` says so in the environment, which only the Accelerator reads: the
    # shared state made here first would otherwise be one process per rank.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    if state.num_processes > 1 and not stage.multi_process:
        parser.error(f"stage {stage.name!r} runs in one process only (not rank-aware)")
    logging.basicConfig(
        level=logging.INFO if state.is_main_process else logging.WARNING,
        format=f"[rank {state.process_index}] %(name)s: %(message)s",
    )
    log.info("%s on %d process(es)", stage.name, state.num_processes)
    config = stage.config.model_validate_json(args.config.read_text())
    inputs = Artifacts.model_validate_json(args.inputs.read_text()) if args.inputs else Artifacts()
    outputs = run_stage(stage, config, inputs, args.out_root, write_record=state.is_main_process)
    state.wait_for_everyone()  # the record is written before any rank exits
    if state.is_main_process:
        print(outputs.model_dump_json())


if __name__ == "__main__":
    main()
