"""chat.call_schema.call_problem against the demo worlds' real tool schemas and a BFCL-style schema."""

from __future__ import annotations

from envace_jax.chat.call_schema import call_problem
from envace_jax.envs.demo_worlds import tool_schemas

BANK = tool_schemas("bank")
CALENDAR = tool_schemas("calendar")


def test_a_call_that_matches_its_schema_has_no_problem():
    assert call_problem("transfer", {"from_account": "ana", "to_account": "ben", "amount": 5}, BANK) is None
    assert call_problem("add_event", {"day": "fri", "hour": 16, "title": "review"}, CALENDAR) is None


def test_each_kind_of_mismatch_is_named():
    assert call_problem("list_events", {"day": "fri"}, BANK) == "no tool named 'list_events'"
    assert "not an object" in call_problem("get_balance", ["ana"], BANK)
    missing = call_problem("transfer", {"from_account": "ana", "amount": 5}, BANK)
    assert "to_account" in missing and "required" in missing
    extra = call_problem("get_balance", {"account": "ana", "currency": "eur"}, BANK)
    assert "currency" in extra
    typed = call_problem("add_event", {"day": "fri", "hour": "16", "title": "review"}, CALENDAR)
    assert typed.startswith("add_event: hour:") and "integer" in typed
    week = [
        {
            "type": "function",
            "function": {
                "name": "open",
                "parameters": {
                    "type": "object",
                    "properties": {"day": {"type": "string", "enum": ["mon", "tue"]}},
                    "required": ["day"],
                },
            },
        }
    ]
    assert call_problem("open", {"day": "mon"}, week) is None
    assert "is not one of" in call_problem("open", {"day": "funday"}, week)


def test_types_json_schema_does_not_know_are_not_checked():
    # BFCL writes "dict" and "float"; such a type is skipped, the rest of the schema still holds
    bfcl = [
        {
            "name": "area",
            "parameters": {
                "type": "dict",
                "properties": {"base": {"type": "float"}, "unit": {"type": "string"}},
                "required": ["base"],
            },
        }
    ]
    assert call_problem("area", {"base": 3.5}, bfcl) is None
    assert call_problem("area", {"base": "wide"}, bfcl) is None
    assert "unit" in call_problem("area", {"base": 3, "unit": 2}, bfcl)
    assert "base" in call_problem("area", {"unit": "m"}, bfcl)
