"""Train the Soft MoE paper's reference agent (google/dopamine `labs/moes`: Atari100kRainbowMoEAgent with
labs/moes/configs/DER.gin, its DataEfficientAtariRunner and its evaluation) on one game, as its atari_100k_train.py
would, with the changes of dopamine_reference.CHANGES.

    .refvenv/bin/python results/reference_training/train.py --dopamine-dir ../dopamine --game Breakout \
        --moe-type SOFTMOE --seed 1 --base-dir results/reference_training/work/dopamine_Breakout_softmoe_s1

The runner checkpoints after every iteration (DER.gin: 10,000 agent steps and 100 evaluation episodes) into
<base-dir>/checkpoints and resumes from the latest one when started again on the same --base-dir. --iteration-steps
2000 --num-iterations 50 --eval-every 5 trains the same 100,000 steps (to within a step a phase) and evaluates at the
same steps, checkpointing every 2,000; run_reference.sh runs that with --eval-every 50, the evaluation at 100k only (a
10,000-step iteration takes 1.1-1.8 hours here, 8-16 hours with the noisy layer as shipped; README). Its
per-iteration statistics go to <base-dir>/logs (Dopamine's logger) and its tensorboard events to <base-dir>/metrics
and <base-dir>.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dopamine-dir", required=True, help="a checkout of google/dopamine at commit 5873f54")
    p.add_argument("--game", default="Breakout", help="Atari game name as Dopamine spells it (Breakout, RoadRunner)")
    p.add_argument(
        "--moe-type", default="SOFTMOE", choices=["SOFTMOE", "BASELINE"], help="FullRainbowMoENetwork.moe_type"
    )
    p.add_argument("--seed", type=int, default=1, help="the run number: the agent's seed, tf's and numpy's")
    p.add_argument("--base-dir", required=True, help="the run's folder (checkpoints, logs, tensorboard)")
    p.add_argument("--num-iterations", type=int, default=10, help="Runner.num_iterations (DER.gin: 10)")
    p.add_argument(
        "--iteration-steps",
        type=int,
        default=10_000,
        help="Runner.training_steps (DER.gin: 10,000), the agent steps between two checkpoints of the runner",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="evaluate after every k-th iteration only (DER.gin: every iteration); with --iteration-steps 2000 and "
        "--eval-every 5 the evaluations fall where DER.gin's do and the runner checkpoints 5x as often",
    )
    p.add_argument("--gin", action="append", default=[], help="extra gin bindings, e.g. 'Runner.training_steps=1000'")
    args = p.parse_args()

    import dopamine_reference

    ref = dopamine_reference.load(args.dopamine_dir)
    import numpy as np
    import tensorflow as tf
    from absl import logging

    logging.set_verbosity(logging.INFO)
    bindings = dopamine_reference.GIN_REPLAY + [
        f"atari_lib.create_atari_environment.game_name = '{args.game}'",
        f"FullRainbowMoENetwork.moe_type = '{args.moe_type}'",
        f"Runner.num_iterations = {args.num_iterations}",
        f"Runner.training_steps = {args.iteration_steps}",
        *args.gin,
    ]
    ref.run_experiment.load_gin_configs([ref.der_gin], bindings)
    os.environ["PYTHONHASHSEED"] = str(args.seed)  # atari_100k_train.set_random_seed
    tf.random.set_seed(args.seed)
    np.random.seed(args.seed)

    def create_agent(sess, environment, summary_writer=None):
        return ref.agent_module.Atari100kRainbowMoEAgent(
            num_actions=environment.action_space.n, seed=args.seed, summary_writer=summary_writer
        )

    class Runner(ref.runner.DataEfficientAtariRunner):
        """The reference's runner, its evaluation phase skipped after all but every --eval-every-th iteration. A
        training phase goes on from the previous one's episode (the runner's resume_state), so shorter iterations
        train as DER.gin's do within one process, to within a step a phase (a phase runs its steps + 1); a restart
        from a checkpoint starts a new episode, as the runner always does."""

        def _run_one_iteration(self, iteration):
            self.evaluate_now = (iteration + 1) % args.eval_every == 0
            return super()._run_one_iteration(iteration)

        def _checkpoint_experiment(self, iteration):
            """The runner's checkpoint (it keeps the last 4), and a copy of the agent's parameters and optimizer state
            at every 10,000 steps (checkpoints/keep_ckpt.<iteration>, ~70 MB each), which compare.py reads."""
            super()._checkpoint_experiment(iteration)
            if (iteration + 1) * args.iteration_steps % 10_000 == 0:
                path = os.path.join(args.base_dir, "checkpoints", f"ckpt.{iteration}")
                if os.path.exists(path):
                    shutil.copyfile(path, os.path.join(args.base_dir, "checkpoints", f"keep_ckpt.{iteration}"))

        def _run_eval_phase(self, statistics):
            if self.evaluate_now:
                return super()._run_eval_phase(statistics)
            logging.info("Evaluation skipped (--eval-every %d)", args.eval_every)
            return 0, 0.0, 0.0

    t0 = time.time()
    runner = Runner(args.base_dir, create_agent)
    runner.run_experiment()
    logging.info("reference run finished in %.0f s", time.time() - t0)


if __name__ == "__main__":
    main()
