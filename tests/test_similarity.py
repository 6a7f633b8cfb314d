"""The model-similarity policy: descriptors, the metric, predictions from a library of measured models, JPA per type.

Checks are properties (identical models are most similar, a prediction is as sure as its neighbours are near
and agree), decisions that follow from the numbers written beside them, and round trips; nothing is compared
with a stored answer.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pilotfill.allocator import Profiler, ScalingCurve
from pilotfill.allocator.profiler import EXPLORE_RATE, PROBE_RATE
from pilotfill.allocator.similarity import Descriptor, Library, LibraryError, Measured, similarity, uninformed
from pilotfill.library_file import read_library, write_library

pytestmark = pytest.mark.unit

TYPES = ["fast", "slow"]


def curve(rate1: float, per_node: float = 1.0, upto: int = 8) -> ScalingCurve:
    """rate1 at one node, ×(1 + per_node·(n−1)) beyond."""
    return ScalingCurve.from_table([0.0] + [rate1 * (1 + per_node * (n - 1)) for n in range(1, upto + 1)])


CNN = Descriptor(parameters=11e6, flops_per_sample=5.5e8, layers=18, batch_size=64, mix={"conv": 0.95, "linear": 0.05})
CNN_BIG = Descriptor(parameters=25e6, flops_per_sample=4e9, layers=50, batch_size=64, mix={"conv": 0.9, "linear": 0.1})
RECSYS = Descriptor(parameters=4e7, layers=2, batch_size=4096, mix={"linear": 1.0})


def library() -> Library:
    """Convolutional models run 5x faster on "fast"; the dense recommender runs 2x faster on "slow"."""
    lib = Library()
    lib.add(Measured("cnn", CNN, {"fast": curve(5000.0), "slow": curve(1000.0)}, "cnn"))
    lib.add(Measured("cnn-big", CNN_BIG, {"fast": curve(600.0), "slow": curve(120.0)}, "cnn"))
    lib.add(Measured("recsys", RECSYS, {"fast": curve(10000.0, 0.0), "slow": curve(20000.0, 0.0)}, "recsys"))
    return lib


def test_a_descriptor_is_checked_where_it_is_made():
    assert Descriptor.from_dict({"parameters": 10, "mix": {"conv": 3, "linear": 1}}).mix == {"conv": 0.75, "linear": 0.25}
    for bad, message in [
        ({"parameters": -1}, "parameters must be a positive"),
        ({"params": 1}, "unknown key 'params'"),
        ({"mix": {"transformer": 1.0}}, "unknown layer kind 'transformer'"),
        ({"mix": {"conv": 0}}, "no positive share"),
        ({"layers": True}, "layers must be a positive"),
    ]:
        with pytest.raises(LibraryError, match=message):
            Descriptor.from_dict(bad)


def test_similarity_is_one_for_the_same_model_symmetric_and_falls_with_distance():
    assert similarity(CNN, CNN) == pytest.approx(1.0)
    assert similarity(CNN, CNN_BIG) == pytest.approx(similarity(CNN_BIG, CNN))
    assert similarity(CNN, CNN_BIG) > similarity(CNN, RECSYS)
    other_batch = Descriptor(parameters=11e6, flops_per_sample=5.5e8, layers=18, batch_size=512, mix=CNN.mix)
    assert similarity(CNN, CNN) > similarity(CNN, other_batch) > similarity(CNN, RECSYS)
    assert similarity(CNN, Descriptor(task_free := None) if False else Descriptor()) == pytest.approx(math.exp(-3.0))  # nothing in common


def test_a_model_is_predicted_fastest_where_the_models_like_it_are():
    lib = library()
    cnn_like = Descriptor(parameters=15e6, flops_per_sample=1e9, layers=34, batch_size=64, mix={"conv": 0.93, "linear": 0.07})
    p = lib.predict(cnn_like, TYPES, 8)
    assert p.neighbours[0][0] in ("cnn", "cnn-big")
    ratio, sigma = p.relative("fast", "slow")
    assert math.exp(ratio) == pytest.approx(5.0, rel=0.05)  # both conv models: 5x
    dense = lib.predict(Descriptor(parameters=3e7, layers=3, batch_size=2048, mix={"linear": 1.0}), TYPES, 8)
    assert dense.neighbours[0][0] == "recsys"
    assert dense.relative("slow", "fast")[0] > 0  # like the recommender: "slow" suits it
    # Sure where the neighbours are near and agree; wide open for a model like nothing measured.
    lone = lib.predict(Descriptor(layers=200, batch_size=1), TYPES, 8)
    assert lone.relative("fast", "slow")[1] > sigma
    assert uninformed(TYPES, 8).relative("fast", "slow") == (0.0, pytest.approx(math.log(4.0)))


def test_leaving_a_family_out_predicts_it_from_the_others():
    lib = library()
    without = lib.without("cnn")
    assert [e.model for e in without.entries] == ["recsys"]
    assert lib.predict(CNN, TYPES, 8, exclude_family="cnn").neighbours == (("recsys", pytest.approx(similarity(CNN, RECSYS), abs=1e-4)),)


def test_a_library_file_round_trips_and_names_what_is_wrong(tmp_path):
    lib = library()
    path = tmp_path / "lib" / "models.json"
    write_library(lib, path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = read_library(path)
    assert [(e.model, e.descriptor, dict(e.curves), e.family) for e in again.entries] == [(e.model, e.descriptor, dict(e.curves), e.family) for e in lib.entries]
    assert len(read_library(tmp_path / "none.json")) == 0  # no library yet: an empty one
    for text, message in [
        ("{", "not valid JSON"),
        ('{"models": 3}', "must be"),
        ('{"format": 9, "models": []}', "format 9"),
        ('{"models": [{"model": "x", "curves": {"a": {"nodes": [1], "samples_per_s": [2]}}}]}', r"models\[0\]: curve for 'a'"),
        ('{"models": [{"model": "x", "descriptor": {"layers": -2}, "curves": {"a": {"nodes": [0, 1], "samples_per_s": [0, 2]}}}]}', "layers must be"),
    ]:
        path.write_text(text)
        with pytest.raises(LibraryError, match=message):
            read_library(path)


def test_jpa_per_type_starts_from_the_prediction_and_gives_way_to_reports():
    lib = library()
    p = lib.predict(CNN, TYPES, 8)
    jpa = Profiler()
    # Nothing reported yet: a token rate everywhere (never evicts a measured job), measured first where predicted best.
    confirmed, optimistic = jpa.typed_curves("j", 1, 8, TYPES, p)
    assert confirmed["fast"].at(1) == confirmed["slow"].at(1) == PROBE_RATE
    assert optimistic["fast"].at(1) == EXPLORE_RATE > optimistic["slow"].at(1)
    # Measured on "slow" at 300/s on one node: "fast" is predicted from that level times the models' 5x, within bounds.
    jpa.observe("j", 1, 300.0, weight=10.0, node_type="slow")
    confirmed, optimistic = jpa.typed_curves("j", 1, 8, TYPES, p)
    assert confirmed["slow"].at(1) == pytest.approx(300.0)
    ratio, sigma = p.relative("fast", "slow")
    point = 300.0 * math.exp(ratio)
    assert confirmed["fast"].at(1) == pytest.approx(point * math.exp(-sigma), rel=1e-6)
    assert optimistic["fast"].at(1) == pytest.approx(point * math.exp(sigma), rel=1e-6)
    assert confirmed["fast"].at(1) < point < optimistic["fast"].at(1)
    # Its own reports on "fast" replace the prediction there at once.
    jpa.observe("j", 1, 900.0, weight=10.0, node_type="fast")
    confirmed, _ = jpa.typed_curves("j", 1, 8, TYPES, p)
    assert confirmed["fast"].at(1) == pytest.approx(900.0)
    assert jpa.measured_types("j") == ["slow", "fast"] or jpa.measured_types("j") == ["fast", "slow"]
    # Grown on "fast" past every count it reported at there: valued at that count as exploring expected, until it reports.
    confirmed, optimistic = jpa.typed_curves("j", 1, 8, TYPES, p, trying=("fast", 4))
    assert confirmed["fast"].at(4) == pytest.approx(optimistic["fast"].at(4)) and confirmed["fast"].at(4) > 900.0 * 1.5
    assert confirmed["slow"].at(4) == pytest.approx(300.0)  # the other type: what it reported there


def test_a_model_like_nothing_measured_is_measured_once_on_every_type_at_its_minimum_size():
    """A far model's predicted speeds are not trusted for exploring: measured on one type, every other type is worth
    measuring first (as before any report; the type with the higher upper bound first) while the job runs at its
    minimum size — a short run there — and its bounds are what they were once it grew. Moves still go by the lower
    bound."""
    lib = library()
    far_model = Descriptor(parameters=3e9, layers=200, batch_size=1)
    p = lib.predict(far_model, ["fast", "slow", "mid"], 8)
    assert p.nearest < 0.25
    jpa = Profiler()
    jpa.observe("j", 1, 300.0, weight=10.0, node_type="slow")
    types = ["fast", "slow", "mid"]
    plain_c, plain_o = jpa.typed_curves("j", 1, 8, types, p, trying=("slow", 1))
    confirmed, optimistic = jpa.typed_curves("j", 1, 8, types, p, trying=("slow", 1), far=True)
    for t in ("fast", "mid"):
        assert confirmed[t].at(1) == pytest.approx(plain_c[t].at(1))  # moves: the lower bound, as before
        assert optimistic[t].at(1) > 1e6 * plain_o[t].at(1) and optimistic[t].at(1) <= EXPLORE_RATE  # measure it first
    first = max(("fast", "mid"), key=lambda t: plain_o[t].at(1))
    assert optimistic[first].at(1) == EXPLORE_RATE >= optimistic[{"fast": "mid", "mid": "fast"}[first]].at(1)
    assert optimistic["slow"].at(1) == pytest.approx(plain_o["slow"].at(1))  # measured there: its own
    # Grown past its minimum size: not a cheap measurement any more, the bounds stand.
    _, grown = jpa.typed_curves("j", 1, 8, types, p, trying=("slow", 4), far=True)
    _, plain_grown = jpa.typed_curves("j", 1, 8, types, p, trying=("slow", 4))
    assert grown["fast"].at(4) == pytest.approx(plain_grown["fast"].at(4))
    # Measured on every type: its own rates decide, nothing is probed.
    jpa.observe("j", 1, 900.0, weight=10.0, node_type="fast")
    jpa.observe("j", 1, 500.0, weight=10.0, node_type="mid")
    _, optimistic = jpa.typed_curves("j", 1, 8, types, p, trying=("mid", 1), far=True)
    assert max(c.at(1) for c in optimistic.values()) < 1e4


def test_single_type_jpa_is_unchanged_by_types():
    a, b = Profiler(), Profiler()
    for n, r in ((1, 100.0), (2, 190.0), (4, 350.0)):
        a.observe("j", n, r, weight=5.0)
        b.observe("j", n, r, weight=5.0)
        b.observe("j", n, 3 * r, weight=5.0, node_type="other")  # reports on a type do not touch the untyped curve
    for n in range(0, 9):
        assert a.confirmed("j", 1, 8).at(n) == b.confirmed("j", 1, 8).at(n)
        assert a.curve("j", 1, 8).at(n) == b.curve("j", 1, 8).at(n)


def test_a_model_measured_on_fewer_nodes_says_nothing_of_scaling_past_them():
    """A neighbour measured on one node (a single-GPU model) must not read as one that does not scale: past the
    most nodes it was measured on, the shape is the other neighbours' — linear where none was measured that far."""
    wide = Measured("wide", CNN, {"fast": curve(1000.0), "slow": curve(200.0)}, "a")  # linear up to 8 nodes
    narrow = Measured("narrow", CNN, {"fast": ScalingCurve((0, 1), (0.0, 900.0)), "slow": ScalingCurve((0, 1), (0.0, 250.0))}, "b")
    both = Library([wide, narrow]).predict(CNN, TYPES, 8)
    assert both.shape("fast", np.array([2.0, 8.0])) == pytest.approx([2.0, 8.0])  # the wide model's, not flattened
    alone = Library([narrow]).predict(CNN, TYPES, 8)
    assert alone.shape("slow", np.array([1.0, 4.0, 8.0])) == pytest.approx([1.0, 4.0, 8.0])  # nothing known past one node: linear
    # A job that ran on 8 "slow" nodes at 800/s is predicted on one "fast" node from its rate per node (100/s), times
    # the neighbour's speed ratio (900/250): not from its 8-node rate as if it did not scale.
    jpa = Profiler()
    jpa.observe("j", 8, 800.0, weight=10.0, node_type="slow")
    confirmed, optimistic = jpa.typed_curves("j", 1, 8, TYPES, alone)
    ratio, sigma = alone.relative("fast", "slow")
    assert math.exp(ratio) == pytest.approx(900.0 / 250.0)
    assert confirmed["fast"].at(1) == pytest.approx(100.0 * math.exp(ratio - sigma), rel=1e-6)
    assert optimistic["fast"].at(1) == pytest.approx(100.0 * math.exp(ratio + sigma), rel=1e-6)


def test_equally_similar_models_all_count_whatever_the_order_of_the_library():
    """Five models exactly as similar (a descriptor without a batch size against one family's five batch sizes):
    the prediction keeps all of them, so it does not depend on which the library happened to list first."""
    query = Descriptor(parameters=11e6, layers=18)
    entries = [Measured(f"cnn-bs{b}", Descriptor(parameters=11e6, layers=18, batch_size=b), {"fast": curve(100.0 * k), "slow": curve(100.0)}, "cnn")
               for k, b in enumerate((16, 32, 64, 128, 256), start=2)]  # fmt: skip
    forward, backward = Library(entries).predict(query, TYPES, 8), Library(entries[::-1]).predict(query, TYPES, 8)
    assert len(forward.neighbours) == 5
    assert forward.relative("fast", "slow") == pytest.approx(backward.relative("fast", "slow"))
    assert math.exp(forward.relative("fast", "slow")[0]) == pytest.approx(math.exp(np.mean(np.log([2, 3, 4, 5, 6]))))
