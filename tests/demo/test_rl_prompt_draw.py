"""The demo's RL prompt draw (demo.data.draw_rl_tasks): the push-back share, and the odds of a silent
push-back against the happy path of the same task type."""

import collections
import json

import pytest

from envace_jax.data import demo_tasks as dt
from envace_jax.demo.config import DemoConfig
from envace_jax.demo.data import draw_rl_tasks, silent_push_back


def _tool_errors(task):
    out = []
    for m in task["reference_messages"]:
        if m["role"] == "tool":
            body = json.loads(m["content"])
            if isinstance(body, dict) and "error" in body:
                out.append(body)
    return out


def test_a_silent_push_back_is_one_no_tool_error_announces():
    tasks = dt.generate_tasks(600, 5, "train")
    kinds = collections.Counter()
    for t in tasks:
        expected = t["branch"] == dt.PUSH_BACK and not _tool_errors(t)
        assert silent_push_back(t) == expected, t["uid"]
        kinds[(t["branch"], bool(_tool_errors(t)))] += 1
    # all three kinds occur in a natural stream: happy, announced push-back, silent push-back
    assert kinds[(dt.HAPPY, False)] and kinds[(dt.PUSH_BACK, True)] and kinds[(dt.PUSH_BACK, False)]


def _odds(tasks, task_type):
    happy = sum(t["task_type"] == task_type and t["branch"] == dt.HAPPY for t in tasks)
    silent = sum(t["task_type"] == task_type and silent_push_back(t) for t in tasks)
    return happy / silent


@pytest.mark.parametrize("seed,share", [(2, 0.75), (7, 0.6)])
def test_natural_silent_odds_keep_the_share_and_the_odds_of_the_most_silent_type(seed, share):
    n = 500
    natural = dt.generate_tasks(4000, seed, "train")
    exclude = {t["uid"] for t in natural[:40]}
    cfg = DemoConfig(seed=seed, base_dir="unused", rl_tasks=n, rl_push_back_share=share, rl_silent_odds="natural")
    drawn = draw_rl_tasks(cfg, exclude)

    assert len(drawn) == n and len({t["uid"] for t in drawn}) == n
    assert not exclude & {t["uid"] for t in drawn}
    assert all(dt.split_of(t) == "train" for t in drawn)
    n_pb = dt.branch_plan(n, share).count(dt.PUSH_BACK)
    assert sum(t["branch"] == dt.PUSH_BACK for t in drawn) == n_pb
    # the push-backs are the natural stream's first ones (after the excluded tasks)
    stream_pb = [t["uid"] for t in natural if t["branch"] == dt.PUSH_BACK and t["uid"] not in exclude]
    assert [t["uid"] for t in drawn if t["branch"] == dt.PUSH_BACK] == stream_pb[:n_pb]

    # the type whose push-backs are most often silent (the conditional requests) keeps its natural odds ...
    share_silent = collections.Counter(t["task_type"] for t in natural if silent_push_back(t))
    size = collections.Counter(t["task_type"] for t in natural)
    most = max(share_silent, key=lambda k: share_silent[k] / size[k])
    assert share_silent[most] / size[most] > 0.3
    assert _odds(drawn, most) == pytest.approx(_odds(natural, most), rel=0.15)
    # ... which forcing the share by branch alone does not: there its happy paths are a few percent
    forced = draw_rl_tasks(cfg.replace(rl_silent_odds="share"), exclude)
    assert _odds(forced, most) < 0.5 * _odds(natural, most)


def test_rl_silent_odds_rejects_unknown_values():
    with pytest.raises(ValueError, match="rl_silent_odds must be one of"):
        DemoConfig(rl_silent_odds="balanced")
