"""The rolling-batch schedule of ``rl.rollout.RolloutEngine`` (``rollout.rolling``; ``engine`` below is the
engine): each episode moves on as soon as its own generations are back, through clients that stream
(``submit``/``step``, e.g. ``rl.rolling_client.RollingSamplerClient``), so a finished row's sampler slot goes to
the next waiting request instead of idling until the slowest row of a lockstep call ends.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from envace_jax.rl.types import ACT, REHEARSE, Episode, State


def run_rolling(engine: Any, records: Sequence[dict], uids: Sequence[str] | None) -> list[Episode]:
    """Episodes advance independently: an episode's next micro-step is queued as soon as all of
    its current generations are back, so the clients' slots never wait for other episodes.

    Each episode goes through the same transitions, seeds and caps as in ``step`` (its micro-step
    count ``e.steps`` is the lockstep step number); only the order across episodes changes.
    """
    cfg = engine.cfg
    episodes = engine.start(records, uids)
    shared = cfg.mode in ("rehearsal", "caller_frozen")
    sim_client = engine.policy if shared or cfg.mode == "real" else engine.simulator
    open_: dict[tuple[str, int], tuple[Episode, int]] = {}  # (client, ticket) -> (episode, index)
    rounds: dict[int, list] = {}  # episode id -> [(request, output|None)]
    clients = {"policy": engine.policy, "simulator": sim_client}
    tick = 0
    try:
        while True:
            engine._check_cancel()
            for e in episodes:
                # (an episode with the judge, only while streaming, waits for its verdict)
                if e.done or e.episode_id in rounds or e.state == State.INTERACTING:
                    continue
                if e.steps >= cfg.max_steps:
                    engine._terminate(e, "step_cap")
                    engine.policy.release([engine._key(e)])
                    continue
                e.steps += 1
                reqs = engine._requests(e, e.steps - 1)
                rounds[e.episode_id] = [[r, None] for r in reqs]
                for i, r in enumerate(reqs):
                    name = "policy" if r.role == ACT or shared else "simulator"
                    (t,) = clients[name].submit([r])
                    open_[(name, t)] = (e, i)
            if not open_ and not (engine._stream is not None and engine._stream.pending):
                break
            for name in ("policy", "simulator"):
                client = clients[name]
                if name == "simulator" and client is engine.policy:
                    continue
                if not any(k[0] == name for k in open_):
                    continue
                n_calls = len(getattr(client, "calls", ()))
                t0 = time.perf_counter()
                finished = client.step()
                engine._span("generate_s", t0)
                for c in getattr(client, "calls", [])[n_calls:]:
                    engine.sampler_calls.append(
                        {"client": name, ACT: c.rows.get(ACT, 0), REHEARSE: c.rows.get(REHEARSE, 0)}
                    )
                for t, _, out in finished:
                    e, i = open_.pop((name, t))
                    rounds[e.episode_id][i][1] = out
            ended = []
            for e in episodes:
                got = rounds.get(e.episode_id)
                if got is None or any(out is None for _, out in got):
                    continue
                del rounds[e.episode_id]
                was_live = not e.done
                apply_round(engine, e, got)
                if was_live and e.done:
                    ended.append(engine._key(e))
            ended.extend(engine._key(e) for e in engine._judge_tick(episodes, tick) if e.done)
            tick += 1
            if ended:
                engine.policy.release(ended)
    finally:
        engine.policy.release([engine._key(e) for e in episodes])
    for e in episodes:
        engine._finalize(e)
    return episodes


def apply_round(engine: Any, e: Episode, got: list) -> None:
    """Routes one micro-step's outputs of ``e`` back, in request order, as ``step`` does."""
    for req, out in got:
        if req.role == ACT:
            engine._on_act(e, req, out)
            engine._after_act(e)
        elif e.state == State.AWAIT_SIMULATOR:  # an earlier sibling's cache_full may have ended it
            engine._on_rehearse(e, req, out)
    if (
        e.state == State.AWAIT_SIMULATOR
        and got[0][0].role == REHEARSE
        and len(e.pending_results) == len(e.pending_calls)
    ):
        engine._close_tool_turn(e)
