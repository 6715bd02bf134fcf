"""BFCL harness: the oracle policy through our loop, parser and BFCL's own checkers; negative controls;
a tiny random Qwen3 on every multi_turn_base entry."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="envace_bfcl_test_"))
pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")

from envace_jax.envs import bfcl
from envace_jax.eval import bfcl_eval as B
from envace_jax.eval.harness import AgentTurn
from envace_jax.eval.results import load_results
from envace_jax.eval.runner import run_eval


def test_oracle_is_valid_on_every_multi_turn_base_entry(tmp_path):
    res = run_eval(
        {"suite": "bfcl", "policy": "oracle", "output_dir": str(tmp_path), "bfcl": {"categories": "multi_turn_base"}}
    )
    back = load_results(str(tmp_path))
    assert back == res | {"wall_seconds": back["wall_seconds"]}
    row = back["categories"]["multi_turn_base"]
    assert (row["count"], row["valid"], row["accuracy"]) == (200, 200, 1.0), row["errors"]
    # Every GT call was really played through our loop, not short-circuited.
    assert row["calls_mean"] * 200 >= 1140


def test_oracle_on_other_multi_turn_categories_subset():
    for cat in ("multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"):
        r = B.evaluate_multi_turn(cat, "oracle", B.BfclConfig(limit=8))
        assert r.valid == r.count == 8, (cat, r.row())


def test_miss_func_reveals_the_held_out_function_at_its_turn():
    entries = bfcl.load_entries("multi_turn_miss_func")[:5]
    gts = bfcl.load_ground_truth("multi_turn_miss_func")
    eps = B.play_multi_turn(entries, B.BfclMultiTurnOracle(entries, gts), B.BfclConfig())
    for e, ep in zip(entries, eps):
        ((turn, docs),) = e["missed_function"].items()
        users = [m["content"] for m in ep.conv.messages if m["role"] == "user"]
        assert B.MISS_FUNC_PROMPT in users
        names = {t["function"]["name"] for t in ep.conv.tools}
        assert {d["name"] for d in docs} <= names
        assert len(ep.conv.tools) == len(e["function"]) + len(docs)


def test_oracle_on_single_turn_categories_subset():
    cfg = B.BfclConfig(categories=bfcl.SINGLE_TURN_CATEGORIES, limit=12)
    for r in B.evaluate("oracle", cfg):
        assert r.valid == r.count == min(12, r.count) and r.count > 0, (r.name, r.row())


class _Perturbed:
    """The multi-turn oracle with the second step of turn 0 replaced by a final reply."""

    def __init__(self, oracle):
        self.oracle = oracle

    def act(self, convs):
        outs = self.oracle.act(convs)
        return [AgentTurn("I am done.") if c.turn == 0 and c.step == 1 else o for c, o in zip(convs, outs)]

    def release(self, keys):
        pass


def test_checker_rejects_a_perturbed_oracle():
    entries = bfcl.load_entries("multi_turn_base")[:6]
    gts = bfcl.load_ground_truth("multi_turn_base")
    eps = B.play_multi_turn(entries, _Perturbed(B.BfclMultiTurnOracle(entries, gts)), B.BfclConfig())
    verdicts = [bfcl.check_multi_turn(ep.trajectory, ep.entry, gts[ep.entry["id"]]) for ep in eps]
    # Entries whose first turn has >= 2 GT calls lose a state change or a response; the checker must see it.
    cut = [v for e, v in zip(entries, verdicts) if len(gts[e["id"]][0]) >= 2]
    assert cut and not any(v["valid"] for v in cut)


def test_step_limit_force_quits_like_bfcl():
    entry = bfcl.load_entries("multi_turn_base")[0]

    class Looper:  # calls a harmless function forever
        def act(self, convs):
            return [AgentTurn('<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>') for _ in convs]

        def release(self, keys):
            pass

    (ep,) = B.play_multi_turn([entry], Looper(), B.BfclConfig(max_steps_per_turn=3))
    assert ep.termination == "step_limit" and len(ep.trajectory) == 1 and len(ep.trajectory[0]) == 4
    # each call really ran in the GorillaFileSystem of the entry (its cwd is the scenario root)
    assert [m["content"] for m in ep.conv.messages if m["role"] == "tool"][0].startswith(
        '{"current_working_directory": '
    )


def test_single_turn_parse_errors_and_wrong_values_fail():
    entries = bfcl.load_entries("simple_python")[:2]

    class Bad:
        def act(self, convs):
            return [
                AgentTurn("<tool_call>\nnot json\n</tool_call>"),
                AgentTurn(
                    '<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>' % entries[1]["function"][0]["name"]
                ),
            ][: len(convs)]

        def release(self, keys):
            pass

    r = B.evaluate_single_turn("simple_python", Bad(), B.BfclConfig(limit=2))
    assert r.valid == 0
    assert r.entries[0].error_type == "parse:JSON_DECODE_ERROR"
    assert r.entries[1].error_type.startswith("simple_function_checker:")


@pytest.mark.slow
def test_tiny_random_model_runs_every_multi_turn_base_entry(tmp_path):
    from tests.helpers_eval import load_config

    cfg = load_config("eval_bfcl_tiny.py")
    cfg.output_dir = str(tmp_path)
    res = run_eval(cfg)
    row = res["categories"]["multi_turn_base"]
    assert row["count"] == 200 and 0 <= row["valid"] <= 200
    assert row["generated_tokens_mean"] > 0  # the model really generated
    assert load_results(str(tmp_path))["categories"]["multi_turn_base"]["count"] == 200


def test_line_level_tokenizer_shrinks_bfcl_prompts_and_round_trips(tmp_path):
    from envace_jax.chat import build_demo_tokenizer, render_chat_text
    from envace_jax.data.demo_tasks import demo_corpus
    from envace_jax.eval.harness import bfcl_corpus

    corpus = demo_corpus(8) + bfcl_corpus()
    word = build_demo_tokenizer(corpus, tmp_path / "qwen", vocab_size=4096)
    line = build_demo_tokenizer(corpus, tmp_path / "lines", vocab_size=4096, pre_split="lines", max_token_chars=64)
    entries = bfcl.load_entries("multi_turn_base")[::40]
    for e in entries:
        text = render_chat_text(
            [dict(m) for m in e["question"][0]], bfcl.BfclMultiTurnEnv(e).tool_schemas, enable_thinking=False
        )
        ids = line.encode(text, add_special_tokens=False)
        assert line.decode(ids) == text
        assert 3 * len(ids) < len(word.encode(text, add_special_tokens=False)), e["id"]
        assert max(len(line.decode([i])) for i in ids) <= 64
    with pytest.raises(ValueError, match="pre_split"):
        build_demo_tokenizer(corpus, tmp_path / "bad", pre_split="words")


def test_rolling_batch_keeps_every_slot_busy_and_entry_order():
    entries = bfcl.load_entries("multi_turn_base")[:7]
    gts = bfcl.load_ground_truth("multi_turn_base")
    oracle = B.BfclMultiTurnOracle(entries, gts)
    sizes = []

    class Counting:
        def act(self, convs):
            sizes.append(len(convs))
            return oracle.act(convs)

        def release(self, keys):
            pass

    eps = B.play_multi_turn(entries, Counting(), B.BfclConfig(batch_size=3))
    assert [ep.entry["id"] for ep in eps] == [e["id"] for e in entries]
    assert all(bfcl.check_multi_turn(ep.trajectory, ep.entry, gts[ep.entry["id"]])["valid"] for ep in eps)
    # 3 live entries until the queue runs dry: one agent call per oracle step of the busiest slot.
    steps = [sum(len(t) + 1 for t in gts[e["id"]]) for e in entries]
    assert sum(sizes) == sum(steps)
    first_short = sizes.index(next(s for s in sizes if s < 3))
    assert all(s == 3 for s in sizes[:first_short]) and first_short >= min(steps)
