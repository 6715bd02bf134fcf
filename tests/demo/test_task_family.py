"""The demo's ``task_family`` field: opt-in, the default draws unchanged, RL prompts and held-out tasks of
the chosen family."""

from __future__ import annotations

import pytest

from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.demo.config import DemoConfig
from envace_jax.demo.data import draw_rl_tasks, held_out_tasks, normalize_task


def test_default_family_draws_what_it_drew_before():
    cfg = DemoConfig(base_dir="unused", test_tasks=12, eval_push_back_share=0.5)
    assert cfg.task_family == "default"
    want = [normalize_task(t) for t in generate_tasks(12, 0, "test", push_back_share=0.5)]
    assert held_out_tasks(cfg, "test") == want


def test_irreversible_family_feeds_rl_and_evaluation():
    cfg = DemoConfig(base_dir="unused", task_family="irreversible", rl_tasks=10, test_tasks=8, eval_push_back_share=0.5)
    test = held_out_tasks(cfg, "test")  # the push-back share does not apply: the family has no push-back branch
    assert [t["uid"] for t in test] == [t["uid"] for t in generate_tasks(8, 0, "test", family="irreversible")]
    first = generate_tasks(3, 0, "train", family="irreversible")
    rl = draw_rl_tasks(cfg, exclude_uids={t["uid"] for t in first})
    assert len(rl) == 10 and all(t["env"]["name"] == "wire" for t in rl)
    assert [t["uid"] for t in rl] == [t["uid"] for t in generate_tasks(13, 0, "train", family="irreversible")[3:]]
    assert not {t["uid"] for t in rl} & {t["uid"] for t in test}


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="task_family must be one of"):
        DemoConfig(task_family="wire")
