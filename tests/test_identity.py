"""Which call an app call is: a digest of the code that runs, not the function's name (issue 54, items 1 and 2)."""

from __future__ import annotations

import textwrap

import pytest

from pilotfill.executors.identity import call_key, code_digest

pytestmark = pytest.mark.unit


def define(source: str, name: str = "train", **scope):
    """``name`` from ``source`` as a campaign script defines it (module ``__main__``)."""
    namespace = {"__name__": "__main__", **scope}
    exec(compile(textwrap.dedent(source), "<campaign>", "exec"), namespace)
    return namespace[name]


V1 = """
EPOCHS = 4
def helper(x):
    return x * EPOCHS
def train(lr):
    return helper(lr) + 1
"""


def test_the_same_code_has_the_same_digest_wherever_it_stands():
    moved = "\n\n# a comment above moves every line\n\n" + V1
    assert code_digest(define(V1)) == code_digest(define(moved))


@pytest.mark.parametrize(
    "edit",
    [
        ("return helper(lr) + 1", "return helper(lr) + 2"),  # the app's own body
        ("return x * EPOCHS", "return x * EPOCHS * 2"),  # a helper it calls
        ("EPOCHS = 4", "EPOCHS = 5"),  # a constant a helper uses
    ],
)
def test_an_edit_of_what_runs_changes_the_digest(edit):
    before, after = edit
    assert code_digest(define(V1)) != code_digest(define(V1.replace(before, after)))


def test_two_campaigns_functions_of_one_name_are_two_calls():
    first = define("def work(x):\n    return x + 3\n", "work")
    second = define("def work(x):\n    return x * 3\n", "work")
    assert call_key(first, (1,), {}) != call_key(second, (1,), {})
    assert call_key(first, (1,), {}) == call_key(define("def work(x):\n    return x + 3\n", "work"), (1,), {})


def test_libraries_are_named_not_walked():
    import json

    uses = define("def train(x):\n    return json.dumps(x)\n", json=json)
    assert code_digest(uses) == code_digest(define("def train(x):\n    return json.dumps(x)\n", json=json))


def test_an_app_is_identified_through_its_wrappers():
    import pilotfill

    plain = define(V1)
    app = pilotfill.elastic_app(max_nodes=2)(plain)
    assert code_digest(app.func) == code_digest(plain)


def test_parsl_identifies_functions_by_their_code_once_pilotfill_registered():
    from parsl.dataflow.memoization import id_for_memo

    import pilotfill.executors.identity  # noqa: F401

    assert id_for_memo(define(V1)) != id_for_memo(define(V1.replace("+ 1", "+ 2")))
