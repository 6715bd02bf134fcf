"""LocalModelJudge with a deterministic generate_texts callable standing in for the sampler."""

from __future__ import annotations

import json
import re

import pytest

from envace_jax.rl.judges import JudgeRequest, LocalModelJudge


def request(question, reply, tag):
    return JudgeRequest(
        item={
            "question": question,
            "focus_on": "assistant.content.user_visible_reply",
            "pass_condition": f"reply mentions {question}",
            "failure_examples": [],
            "evidence": [],
            "weight": 1.0,
        },
        previous_messages=[],
        current_messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": f"<think>x</think>{reply}"},
        ],
        tag=tag,
    )


class KeywordModel:
    """A 'judge model' that reads the prompt it is given: passes iff the question word is in the reply.

    ``garble`` maps a question word to how many first attempts come back malformed.
    """

    def __init__(self, garble=None):
        self.garble = dict(garble or {})
        self.calls: list[list[list[dict]]] = []

    def __call__(self, prompts):
        self.calls.append(prompts)
        out = []
        for p in prompts:
            assert len(p) == 1 and p[0]["role"] == "user"
            text = p[0]["content"]
            word = re.search(r"\*\*Question:\*\* (\w+)", text).group(1)
            reply = re.search(r"content.user_visible_reply: (.*)", text).group(1)
            if self.garble.get(word, 0) > 0:
                self.garble[word] -= 1
                out.append("<think>let me see</think>The answer is probably yes.")
                continue
            verdict = {
                "high_level_understanding_of_the_question": word,
                "analysis_of_if_focus_on": "present",
                "analysis_of_pass_condition": "checked",
                "analysis_of_failure_examples": "none",
                "answer": word.lower() in reply.lower(),
            }
            out.append(f"<think>thinking about {word}</think>\n```json\n{json.dumps(verdict)}\n```")
        return out


def test_verdicts_follow_the_prompt_content():
    model = KeywordModel()
    reqs = [request("paris", "It is sunny in Paris", "a"), request("rome", "It is sunny in Paris", "b")]
    v = LocalModelJudge(model).judge_many(reqs)
    assert [(x.passed, x.ok, x.api_failed, x.attempts) for x in v] == [(True, True, False, 1), (False, True, False, 1)]
    assert v[0].raw["analysis_of_if_focus_on"] == "present"
    # One batched call, carrying exactly the prompt the HTTP judge would send.
    assert len(model.calls) == 1 and model.calls[0][1][0]["content"] == reqs[1].prompt()


def test_only_malformed_requests_are_regenerated():
    model = KeywordModel(garble={"rome": 2})
    reqs = [request("paris", "Paris", "a"), request("rome", "Rome", "b"), request("oslo", "Rome", "c")]
    v = LocalModelJudge(model, max_attempts=3).judge_many(reqs)
    assert [len(batch) for batch in model.calls] == [3, 1, 1]
    assert [(x.passed, x.ok, x.attempts) for x in v] == [(True, True, 1), (True, True, 3), (False, True, 1)]


def test_malformed_after_all_attempts_is_an_api_failure():
    model = KeywordModel(garble={"rome": 10})
    v = LocalModelJudge(model, max_attempts=2).judge_many(
        [request("rome", "Rome", "b"), request("paris", "Paris", "a")]
    )
    assert (v[0].passed, v[0].ok, v[0].api_failed, v[0].attempts) == (False, False, True, 2)
    assert "no JSON object" in v[0].raw
    assert v[1].passed and v[1].ok


def test_bad_callable_or_config_is_an_error():
    with pytest.raises(ValueError, match="returned 0 texts for 1 prompts"):
        LocalModelJudge(lambda prompts: []).judge_many([request("a", "a", "x")])
    with pytest.raises(ValueError, match="max_attempts"):
        LocalModelJudge(KeywordModel(), max_attempts=0)
    assert LocalModelJudge(KeywordModel()).judge_many([]) == []
