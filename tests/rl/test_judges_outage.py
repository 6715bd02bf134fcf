"""Episodes whose judge failed: masked out of the loss and the baselines (faithful: trained on), counted,
warned about, and a run that stops after consecutive outage steps.

The judge is a real OpenAI-style HTTP server on 127.0.0.1 whose answer depends on the judged reply:
``PASSME`` passes, ``OUTAGE`` gets HTTP 503 on every attempt, anything else fails the item.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.config import ConfigError, JudgeSection, RLSection, RoleSampling, RolloutConfig, load_config
from envace_jax.rl.advantages import role_wise_advantages
from envace_jax.rl.judge_outage import JudgeOutageError, JudgeOutageMonitor, judge_mask
from envace_jax.rl.judges import HttpJudge, HttpJudgeConfig
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import RolloutEngine
from envace_jax.rl.step import RLStep
from envace_jax.rl.types import ACT, REHEARSE
from tests.helpers_rollout import RecordingTrainer, one_turn_record


# ----------------------------------------------------------------------------- the judge server


class OutageServer:
    """Answers each verdict request by the marker in the judged assistant reply; counts attempts."""

    def __init__(self):
        self.attempts = {"PASSME": 0, "OUTAGE": 0, "other": 0}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                current = body["messages"][0]["content"].split("# Current Messages to Evaluate", 1)[1]
                mark = next((m for m in ("PASSME", "OUTAGE") if m in current), "other")
                with server.lock:
                    server.attempts[mark] += 1
                if mark == "OUTAGE":
                    status, payload = 503, {"error": "judge model is down"}
                else:
                    v = {
                        "high_level_understanding_of_the_question": "q",
                        "analysis_of_if_focus_on": "f",
                        "analysis_of_pass_condition": "p",
                        "analysis_of_failure_examples": "e",
                        "answer": mark == "PASSME",
                    }
                    status, payload = (
                        200,
                        {"choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(v)}}]},
                    )
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = OutageServer()
    yield s
    s.close()


def http_judge(url: str) -> HttpJudge:
    return HttpJudge(
        HttpJudgeConfig(
            base_url=url, timeout_s=5.0, max_attempts=2, backoff_base_s=0.001, backoff_max_s=0.01, max_concurrency=8
        )
    )


# ----------------------------------------------------------------------------- baseline and mask, by hand


def test_baseline_over_judged_rows_only_hand_computed():
    # One (prompt, role) key of four rows; rows 1 and 3 lost their judge (their scores 0 are no verdict).
    scores = jnp.asarray([1.0, 0.0, 0.5, 0.0])
    g, r, e = jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.int32), jnp.arange(4, dtype=jnp.int32)
    valid = jnp.asarray([True, False, True, False])
    adv = lambda base, **kw: np.asarray(role_wise_advantages(scores, g, r, base, episode_ids=e, valid=valid, **kw))
    # mean over the judged rows (1.0, 0.5) = 0.75, not the 0.375 of all four
    np.testing.assert_allclose(adv("row_mean"), [0.25, 0.0, -0.25, 0.0], atol=1e-7)
    np.testing.assert_allclose(adv("trajectory_mean"), [0.25, 0.0, -0.25, 0.0], atol=1e-7)
    np.testing.assert_allclose(adv("rloo"), [0.5, 0.0, -0.5, 0.0], atol=1e-7)  # leave-one-out: the other judged row
    np.testing.assert_allclose(adv("none"), [1.0, 0.0, 0.5, 0.0], atol=1e-7)
    sd = np.std([1.0, 0.5], ddof=1)  # std of the judged rows
    np.testing.assert_allclose(
        adv("row_mean", normalize_std=True), [0.25 / (sd + 1e-6), 0, -0.25 / (sd + 1e-6), 0], rtol=1e-6
    )
    # without a mask: the reference's baseline over all four rows
    np.testing.assert_allclose(role_wise_advantages(scores, g, r), [0.625, -0.375, 0.125, -0.375], atol=1e-7)
    with pytest.raises(ValueError, match="valid must be a bool array"):
        role_wise_advantages(scores, g, r, valid=jnp.ones(3, bool))


def test_mask_drops_keys_left_with_fewer_than_two_judged_episodes():
    # rows: (episode, (group, role)); episodes 1, 4 and 5 lost their judge
    rows = [
        (0, (0, 0)),
        (1, (0, 0)),
        (2, (0, 0)),  # key (0, act): 2 judged left -> kept
        (0, (0, 1)),
        (1, (0, 1)),  # key (0, rehearse): 1 judged left -> dropped
        (3, (1, 0)),
        (4, (1, 0)),
        (5, (1, 0)),  # key (1, act): 1 judged left -> dropped
        (3, (1, 1)),
        (3, (1, 1)),  # key (1, rehearse): lost nothing, one episode -> kept
        (6, (2, 0)),
    ]  # a lone episode that lost nothing -> kept (reference)
    trained, dropped = judge_mask([e for e, _ in rows], [k for _, k in rows], {1, 4, 5})
    assert trained.tolist() == [True, False, True, False, False, False, False, False, True, True, True]
    assert dropped == 2


# ----------------------------------------------------------------------------- the RL step against the server


def record(uid: str) -> dict:
    return one_turn_record(uid, question="Is it right?")


# Episodes 0-3 play prompt p0, 4-7 prompt p1. p0: two judged episodes (1 and 0) and two lost ones;
# p1: one judged episode left, so its key has no baseline and contributes nothing.
REPLIES = ["PASSME", "OUTAGE", "nope", "OUTAGE", "OUTAGE", "OUTAGE", "OUTAGE", "PASSME"]


def rl_step(url: str, mask: bool, replies=tuple(REPLIES), **rl):
    from tests.helpers_rollout import ScriptedClient, codec

    c = codec()
    client = ScriptedClient(
        c,
        acts={
            i: [f"<think>\nok\n</think>\n\nIt is {w}."] * 2  # two steps
            for i, w in enumerate(replies)
        },
    )
    sampling = RoleSampling(temperature=1.0, max_new_tokens=64)
    engine = RolloutEngine(
        RolloutConfig(mode="rehearsal", max_model_len=4096, act=sampling, rehearse=sampling),
        c,
        client,
        ChecklistTurnJudge(http_judge(url)),
    )
    trainer = RecordingTrainer()
    step = RLStep(RLSection(n_rollouts=4, mask_judge_failures=mask, **rl), engine, {ACT: trainer, REHEARSE: trainer})
    return step, trainer


def test_step_masks_lost_episodes_and_baselines_over_judged_ones(server, caplog):
    step, trainer = rl_step(server.url, mask=True)
    res = step([record("p0"), record("p1")], 0)
    lost = [e.termination == "judge_api_failure" for e in res.episodes]
    assert lost == [w == "OUTAGE" for w in REPLIES]
    assert [e.score for e in res.episodes] == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
    assert server.attempts["OUTAGE"] == 5 * 2  # every lost verdict was tried twice
    (batch,) = trainer.batches
    assert batch.size == 8  # masked rows stay, with zero weight
    weights = batch.loss_weights.sum(axis=1)
    assert [bool(w > 0) for w in weights] == [True, False, True, False, False, False, False, False]
    # p0's baseline is the mean of its judged episodes (1 + 0) / 2; p1 has one judged episode: nothing
    np.testing.assert_allclose(batch.advantages, [0.5, 0, -0.5, 0, 0, 0, 0, 0], atol=1e-7)
    m = res.metrics
    assert (
        m["judge/lost_episodes"],
        m["judge/masked_episodes"],
        m["judge/masked_rows"],
        m["judge/dropped_groups"],
        m["judge/failed_verdicts"],
    ) == (5, 5, 6, 1, 5)
    assert m["judge/lost_share"] == m["judge/masked_share"] == pytest.approx(5 / 8)
    # scores of the judged episodes only: an outage does not read as a policy scoring 0
    assert m["episode/score_mean"] == pytest.approx(2 / 3) and m["act/reward_mean"] == pytest.approx(2 / 3)

    # the console warning names the judge and its endpoint, and says what became of the episodes
    monitor = JudgeOutageMonitor(step.engine.judge.describe(), max_share=0.5, max_steps=2)
    from envace_jax.rl.judge_outage import example_error

    with caplog.at_level(logging.WARNING, logger="envace_jax.rl.judge_outage"):
        assert monitor.observe(1, m, example_error(res.episodes)) is None
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert f"HTTP judge {server.url}/v1/chat/completions" in msg and "5 of 8 episodes" in msg
    assert "masked out of the loss" in msg and "HTTPError" in msg and "503" in msg

    # a second step as bad as the first stops the run, with one line that says why
    res2 = step([record("p0"), record("p1")], 1)
    err = monitor.observe(2, res2.metrics, example_error(res2.episodes))
    assert isinstance(err, JudgeOutageError) and "\n" not in str(err)
    assert re.search(
        r"more than 50% of the episodes got no verdict from the HTTP judge http://127\.0\.0\.1:\d+/v1/"
        r"chat/completions .* on 2 consecutive steps \(step 1: 6\d%, step 2: 6\d%\); stopped",
        str(err),
    )
    assert "config.judge.outage_share" in str(err)


def test_faithful_setting_trains_lost_episodes_scored_without_their_items(server):
    # rl.mask_judge_failures=False is the reference: the failed item counts False, the episode trains with
    # score 0 and stays in its baseline (spec 4.2, 8.10).
    step, trainer = rl_step(server.url, mask=False)
    res = step([record("p0"), record("p1")], 0)
    assert [e.termination == "judge_api_failure" for e in res.episodes] == [w == "OUTAGE" for w in REPLIES]
    assert [e.score for e in res.episodes] == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
    (batch,) = trainer.batches
    assert (batch.loss_weights.sum(axis=1) > 0).all()
    np.testing.assert_allclose(batch.advantages, [0.75, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, 0.75], atol=1e-7)
    m = res.metrics
    assert (m["judge/lost_episodes"], m["judge/masked_episodes"], m["judge/masked_rows"]) == (5, 0, 0)
    assert m["episode/score_mean"] == pytest.approx(2 / 8)


def test_masked_rows_are_left_out_when_zero_advantage_rows_are_skipped(server):
    # rl.skip_zero_advantage_rows: only the judged rows with an advantage are sent, and the loss is divided
    # by the judged rows' count (2 rows under seq_mean_token_mean), not by all 8 rows of the step
    step, trainer = rl_step(server.url, mask=True, skip_zero_advantage_rows=True)
    res = step([record("p0"), record("p1")], 0)
    (batch,) = trainer.batches
    assert batch.size == 2 and (batch.loss_weights.sum(axis=1) > 0).all()
    np.testing.assert_allclose(batch.advantages, [0.5, -0.5], atol=1e-7)
    assert trainer.kwargs[0]["loss_count"] == 2.0
    assert res.metrics["update/zero_advantage_rows_skipped"] == 6


def test_all_rows_masked_skips_the_update(server):
    # every episode lost its judge: no update at all (not an Adam step on zero gradients)
    step, trainer = rl_step(server.url, mask=True, replies=["OUTAGE"] * 8)
    res = step([record("p0"), record("p1")], 0)
    assert trainer.batches == [] and res.metrics["update/skipped_no_judged_rows"] == 1.0
    assert res.metrics["judge/lost_share"] == 1.0


# ----------------------------------------------------------------------------- the stop rule and its knobs


def test_monitor_needs_consecutive_bad_steps():
    mon = JudgeOutageMonitor("rule judge", max_share=0.5, max_steps=3, warn=False)
    share = lambda lost: {"judge/lost_episodes": lost, "episode/count": 10}
    # 0.5 is not more than 0.5; a good step resets the streak
    assert [mon.observe(i, share(x)) for i, x in enumerate([6, 9, 5, 6, 7], 1)] == [None] * 5
    err = mon.observe(6, share(10))
    assert isinstance(err, JudgeOutageError) and "(step 4: 60%, step 5: 70%, step 6: 100%)" in str(err)
    assert JudgeOutageMonitor("x", max_share=1.0, max_steps=1).observe(1, share(10)) is None  # 1.0 never stops


@pytest.mark.parametrize(
    "field, value, what",
    [("outage_share", 1.5, r"in \[0, 1\]"), ("outage_share", -0.1, r"in \[0, 1\]"), ("outage_steps", 0, "> 0")],
)
def test_outage_knobs_are_range_checked(field, value, what):
    with pytest.raises(ConfigError, match=rf"^config\.judge\.{field} must be {what}, got {value}$"):
        load_config({"judge": {field: value}})
    with pytest.raises(ConfigError, match=rf"^judge\.{field}"):
        JudgeSection(**{field: value})
    assert JudgeSection().outage_share == 0.5 and JudgeSection().outage_steps == 2
    assert RLSection().mask_judge_failures is True


def test_unreachable_judge_stops_launch_train_with_one_line(tmp_path):
    """The issue's run: the HTTP judge is unreachable. launch/train.py warns at each step and exits non-zero
    after judge.outage_steps steps on which every episode lost its judge, with no update taken."""
    from tests import helpers_loop as h

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    run_dir = str(tmp_path / "run")
    cmd = h.train_cmd(
        run_dir,
        5,
        **{
            "judge.kind": "http",
            "judge.http.base_url": f"http://127.0.0.1:{dead}",
            "judge.http.max_attempts": 1,
            "judge.http.timeout_s": 5.0,
            "judge.outage_steps": 2,
        },
    )
    p = subprocess.run(cmd, env=h.env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "judge outage: more than 50% of the episodes got no verdict from the HTTP judge "
        f"http://127.0.0.1:{dead}/v1/chat/completions"
    ), last
    assert re.search(r"on 2 consecutive steps \(step 1: \d+%, step 2: \d+%\); stopped", last), last
    assert "Connection refused" in last
    warnings = re.findall(r"step (\d): \d+ of 8 episodes \(\d+%\) got no verdict from the HTTP judge", p.stderr)
    assert warnings == ["1", "2"], p.stderr[-3000:]
    from envace_jax.metrics import read_jsonl

    steps = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [s["step"] for s in steps] == [1, 2]
    # each step's lost episodes were masked; the random policy's rows left no judged pair in any group here,
    # so no update was taken (a judged episode without a judged partner has no baseline either)
    assert all(s["judge/masked_episodes"] == s["judge/lost_episodes"] > 4 for s in steps), steps
    assert all(s["judge/masked_rows"] == 8 and s["update/skipped_no_judged_rows"] == 1.0 for s in steps), steps
