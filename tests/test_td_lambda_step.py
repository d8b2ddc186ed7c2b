"""The training step of algos/td_lambda_tetris.py (`shallow_step`, what `--compile` compiles) against a plain reference
loop built from the reference pieces (dense traces, per-run forward passes), and compiled against eager."""

import pytest
import torch

import td_lambda_tetris as td
import td_reference as ref
from envs.tetris import VARIANTS, ColumnEngine, binary_feature_indices, binary_feature_length

HEIGHT, WIDTH, PIECES = VARIANTS["sz"]
GROUPS = [("dsilu", 0, 2), ("relu", 2, 4)]  # 4 runs, two activations
R = 4


def make_step_setup(dtype, variant="sz"):
    height, width, pieces = VARIANTS[variant]
    engine = ColumnEngine(height, width, pieces)
    params = td.init_shallow(R, binary_feature_length(height, width), 50, seed=0, device="cpu")
    params = {k: v.to(dtype) for k, v in params.items()}
    empty_board = torch.zeros(width, dtype=torch.long)
    empty_state = td.shallow_indices(empty_board, empty_board.sum(), height)
    k = td.StepConstants(
        0.99,
        0.01,
        0.99 * 0.55,
        0.5,
        0.00025,
        33.0,
        "next",
        empty_board,
        empty_state,
        torch.full((R,), 10**6),
        td._bias_encoding_table(height, width, empty_board.device),
    )
    return engine, params, k


def play_step(step_fn, dtype, steps, on_host=None, variant="sz"):
    """Run `steps` steps of `step_fn` (shallow_step or its compiled form) as main's loop does, the traces decayed and
    folded by `decay_traces(decay, on_host)`; returns the boards after every step, the final carry and theta."""
    engine, params, k = make_step_setup(dtype, variant)
    learner = td.ShallowTD(params, GROUPS)
    rng = torch.Generator().manual_seed(1)
    pieces_tensor = torch.tensor(VARIANTS[variant][2])

    def new_pieces():
        return pieces_tensor[torch.randint(len(pieces_tensor), (R,), generator=rng)]

    carry = dict(boards=k.empty_board.expand(R, len(k.empty_board)).clone(), states=k.empty_state.expand(R, -1).clone())
    carry.update(pieces=new_pieces(), holes_now=torch.zeros(R, dtype=torch.long), decay=torch.zeros(R))
    carry.update(score=torch.zeros(R), length=torch.zeros(R, dtype=torch.long), active=torch.ones(R, dtype=torch.bool))
    carry.update(placements=torch.zeros((), dtype=torch.long), abs_td_sum=torch.zeros(R))
    carry.update(episodes=torch.zeros(R, dtype=torch.long), scores=torch.zeros(R, 100))
    carry["lengths"] = torch.zeros(R, 100, dtype=torch.long)
    boards = []
    for _ in range(steps):
        uniform = torch.rand(R, engine.num_placements + 1, generator=rng)
        learner.decay_traces(carry["decay"], on_host)
        carry = step_fn(learner, engine, carry, uniform, new_pieces(), k)
        boards.append(carry["boards"])
    return torch.stack(boards), carry, learner.parameters()


def play_reference(dtype, steps):
    """The same games with the reference maths: per-run shallow_value / shallow_value_and_grad and the dense
    update_traces_and_params (eq. 1, 2, 4, 14, 15, 16), the same random draws."""
    engine, theta, k = make_step_setup(dtype)
    e = {name: torch.zeros_like(v) for name, v in theta.items()}
    acts = [name for name, a, b in GROUPS for _ in range(a, b)]
    rng = torch.Generator().manual_seed(1)
    pieces_tensor = torch.tensor(PIECES)
    runs = torch.arange(R)
    boards = torch.zeros(R, WIDTH, dtype=torch.long)
    empty_state = binary_feature_indices(torch.zeros(2 * WIDTH, dtype=torch.long), HEIGHT)  # (20,) of the empty board
    state = empty_state.expand(R, -1)
    pieces = pieces_tensor[torch.randint(len(PIECES), (R,), generator=rng)]
    decay = torch.zeros(R, dtype=dtype)
    episodes = torch.zeros(R, dtype=torch.long)
    holes_now = torch.zeros(R, dtype=torch.long)
    trajectory = []
    for _ in range(steps):
        uniform = torch.rand(R, engine.num_placements + 1, generator=rng)
        next_pieces = pieces_tensor[torch.randint(len(PIECES), (R,), generator=rng)]
        after = engine(boards, pieces)
        cand = binary_feature_indices(after.features(), HEIGHT)  # (R, P, 20)
        v_cand, v_t, grads = [], [], []
        for r, act in enumerate(acts):
            one = {name: v[r : r + 1] for name, v in theta.items()}
            v_cand.append(ref.shallow_value(one, cand[r : r + 1], act))
            value, g = ref.shallow_value_and_grad(one, state[r : r + 1], act)
            v_t.append(value)
            grads.append(g)
        v_cand = torch.cat(v_cand).masked_fill(after.game_over, 0.0)
        v_t = torch.cat(v_t)
        grad = {name: torch.cat([g[name] for g in grads]) for name in ("b1", "w2", "b2")}
        grad["W1"] = (state, torch.cat([g["W1"][1] for g in grads]))
        tau = td.temperature(episodes.float(), k.tau0, k.tau_k)  # float32, as the step
        action = td.select_placement(v_cand, tau, after.valid, uniform)
        game_over = after.game_over[runs, action]
        holes_next = after.holes[runs, action]
        reward = td.td_reward(holes_next, game_over, holes_now, k.holes_scale, k.reward_timing)
        td_error = reward + k.gamma * v_cand[runs, action] - v_t
        ref.update_traces_and_params(theta, e, grad, decay, k.alpha * td_error)
        boards = torch.where(game_over[:, None], 0, after.boards[runs, action])
        state = torch.where(game_over[:, None], empty_state, cand[runs, action])
        holes_now = holes_next.masked_fill(game_over, 0)
        episodes += game_over
        decay = torch.where(game_over, 0.0, k.gamma_lambda).to(dtype)
        pieces = next_pieces
        trajectory.append(boards)
    return torch.stack(trajectory), episodes, theta


def test_shallow_step_plays_the_reference_games_with_the_reference_update():
    """200 steps of 4 runs (two activations, several episode starts and folds) in float64: the same boards after every
    step as the reference loop, the same episode count, and theta equal to 1e-9."""
    boards, carry, theta = play_step(td.shallow_step, torch.float64, 200)
    ref_boards, ref_episodes, ref_theta = play_reference(torch.float64, 200)
    assert torch.equal(boards, ref_boards)
    assert torch.equal(carry["episodes"], ref_episodes) and int(ref_episodes.sum()) >= 8
    assert int(carry["placements"]) == 200 * R
    for name in ref_theta:
        assert torch.allclose(theta[name], ref_theta[name], atol=1e-9), name


def test_trace_fold_through_numpy_views_equals_the_tensor_fold():
    """decay_traces on a CPU takes numpy views of c and A (on_host); a GPU takes tensor ops (on_host=False).
    The same float32 arithmetic: the same games and the same theta, bit for bit."""
    host_boards, host, host_theta = play_step(td.shallow_step, torch.float32, 200, on_host=True)
    boards, carry, theta = play_step(td.shallow_step, torch.float32, 200, on_host=False)
    assert torch.equal(boards, host_boards)
    assert int(carry["episodes"].sum()) > 0  # some episodes ended: the fold at decay 0 ran
    for name in theta:
        assert torch.equal(theta[name], host_theta[name]), name


def test_compiled_step_falls_back_to_eager_with_one_warning(monkeypatch, capsys):
    """When compiling fails (no C compiler, an unsupported op), --compile warns once and plays the eager games."""

    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler found\nsecond line")

    monkeypatch.setattr(td, "compile_graph", broken)
    eager_boards, eager, _ = play_step(td.shallow_step, torch.float32, 20)
    boards, carry, _ = play_step(td.compiled_shallow_step(), torch.float32, 20)
    assert torch.equal(boards, eager_boards)
    assert torch.equal(carry["scores"], eager["scores"])
    out = capsys.readouterr().out
    assert out.count("warning: compiling the step failed (RuntimeError: no C compiler found); running eagerly") == 1


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["sz", "tetris10x10"])
def test_compiled_step_plays_the_same_games_as_the_eager_step(variant):
    """The compiled step (compile_graph's two graphs; 10-40 s of compilation on the project CPU) against eager, float32
    as in training, on SZ-Tetris and on 10x10 Tetris's seven pieces: the same boards after each of 200 steps, the same
    recorded scores and lengths, theta allclose."""
    eager_boards, eager, eager_theta = play_step(td.shallow_step, torch.float32, 200, variant=variant)
    compiled = td.compiled_shallow_step(fallback=False)  # the two graphs --compile runs; fails loudly, no fallback
    boards, carry, theta = play_step(compiled, torch.float32, 200, variant=variant)
    assert torch.equal(boards, eager_boards)
    for name in ("episodes", "scores", "lengths", "placements"):
        assert torch.equal(carry[name], eager[name]), name
    for name in theta:
        assert torch.allclose(theta[name], eager_theta[name], atol=1e-5), name


@pytest.mark.slow
def test_compile_graph_updates_inputs_in_place_and_takes_the_branch_free_side():
    """compile_graph: an in-place update of an input lands in that tensor, the trace takes the branch that
    torch.compiler.is_compiling() selects (the data-dependent one is never traced), and tracing applies nothing."""

    def fn(x, total):
        total.add_(x.sum())
        if torch.compiler.is_compiling() or bool((x > 0).any()):
            return (x * 2,)
        return (x,)

    x, total = torch.tensor([-1.0, -2.0]), torch.zeros(())
    compiled = td.compile_graph(fn, [x, total], {})
    assert float(total) == 0.0  # tracing on fake tensors did not touch the input
    (out,) = compiled(x, total)
    assert torch.equal(out, torch.tensor([-2.0, -4.0]))  # the branch-free side, though no x > 0
    assert float(total) == -3.0
    compiled(x, total)
    assert float(total) == -6.0
    assert torch.compiler.is_compiling() is False  # the flag is lowered again after tracing
