"""ACT rows after a rehearsal memory in the wire world (``demo.wire_memory``): a trap's way out is shown only
after a memory that holds the rule being broken, and a memory never comes with a row that is not in the
reference plan."""

from __future__ import annotations

import json

from envace_jax.data import wire_corpus
from envace_jax.demo import data as demo_data
from envace_jax.demo import wire_memory
from envace_jax.eval.rehearsal import MEMORY_HEADER


def _tasks(n, seed, fn):
    return [demo_data.normalize_task(t) for t in fn(n, seed)]


def test_retry_memories_hold_the_refused_call_in_three_shapes():
    traps = _tasks(30, 2, wire_corpus.retry_tasks)
    for i, t in enumerate(traps):
        m = wire_memory.retry_memory(t, i, 600)
        assert m.startswith(MEMORY_HEADER) and len(m) <= 600
        steps, _ = wire_corpus.rule_blind_attempt(t, 0)
        refused = next((n, a, r) for n, a, r in steps if "error" in json.loads(r))
        # the failed call is listed to avoid, with the refusal the real tool gave
        call = f"{refused[0]}({json.dumps(refused[1], sort_keys=True, separators=(',', ':'))})"
        assert f"- {call} -> {json.loads(refused[2])['error']}"[:60] in m.replace('{"error":"', "").replace('"}', "")
        assert m.count("private rehearsal") == 1
        assert ("1 private rehearsal of" in m) == (i % 3 == 0)
        # only the third shape lists a plan that ran without errors, and it is the reference plan
        assert ("Plan that ran without errors (rehearsal 2)" in m) == (i % 3 == 2)
        if i % 3 == 2:
            first = next(c for m_ in t["reference_messages"] for c in m_.get("tool_calls") or [])
            args = json.dumps(first["function"]["arguments"], sort_keys=True, separators=(",", ":"))
            assert f"1. {first['function']['name']}({args})" in m


def test_rows_are_the_reference_plan_after_a_memory():
    from envace_jax.chat import load_tokenizer

    codec = demo_data.make_codec(load_tokenizer("assets/demo_base_wire/tokenizer"))
    traps = _tasks(9, 1, wire_corpus.retry_tasks)
    plain = _tasks(4, 1, wire_corpus.plain_demonstrations)
    rows = wire_memory.rows(traps, plain, codec, 600, episode0=100)
    want = sum(sum(m["role"] == "assistant" for m in t["reference_messages"]) for t in traps + plain)
    assert len(rows) == want
    assert {r.uid for r in rows} == {t["uid"] for t in traps + plain}
    assert min(r.episode for r in rows) == 100 and all(r.role == "act" for r in rows)
    for t in traps + plain:
        mine = [r for r in rows if r.uid == t["uid"]]
        ref = [m for m in t["reference_messages"] if m["role"] == "assistant"]
        assert len(mine) == len(ref)
        memory = wire_memory.retry_memory(t, traps.index(t), 600) if t in traps else None
        for r, m in zip(mine, ref):
            prompt = codec.decode(r.prompt_ids)
            assert MEMORY_HEADER in prompt  # every row carries a memory: no way out without one
            if memory is not None:
                assert memory.splitlines()[2] in prompt  # the refused call, in this task's memory
            # the target is the reference's own turn: the plan, not the rule-blind attempt
            text = codec.decode(r.gen_ids)
            for c in m.get("tool_calls") or []:
                for v in c["function"]["arguments"].values():
                    assert str(v) in text, (text, c)
