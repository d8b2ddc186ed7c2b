"""Does a 0-29 no-op start change a Breakout game? Under the Atari-100k protocol (no sticky actions) the no-ops are
agent steps of 4 frames; under `nature` they are single emulator frames. After k no-ops, one FIRE and a fixed sequence
of 400 random actions (4 frames each), print the points and the steps the game lasted, for several k and two ALE seeds.
    python results/softmoe_100k_freeze/noop_determinism.py"""

import ale_py
import numpy as np

ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def play(noops: int, seed: int, frames_per_noop: int) -> tuple[int, int]:
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(ale_py.roms.get_rom_path("breakout"))
    ale.reset_game()
    actions = ale.getMinimalActionSet()
    for _ in range(noops * frames_per_noop):
        ale.act(actions[0])
    rng, points = np.random.default_rng(0), 0
    for t in range(400):
        action = actions[1] if t == 0 else actions[rng.integers(len(actions))]  # FIRE, then the fixed sequence
        points += sum(ale.act(action) for _ in range(4))
        if ale.game_over():
            break
    return points, t + 1


print("no-ops | agent steps (4 frames), seed 1 | seed 2 | emulator frames, seed 1  (points, steps)")
for k in (0, 1, 7, 13, 29):
    print(f"{k:6d} | {play(k, 1, 4)} | {play(k, 2, 4)} | {play(k, 1, 1)}")
