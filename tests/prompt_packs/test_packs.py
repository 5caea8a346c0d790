"""Pack files: loading, errors, the registry, expansion to queries and applying answers."""

from __future__ import annotations

import math

import pytest
import yaml

from prompt_packs.apply import apply_pack, expand_pack
from prompt_packs.format import Calibration, PackCalibration
from prompt_packs.registry import (
    PackError,
    PackRegistry,
    UnknownPackError,
    load_pack,
    write_calibration,
)


def test_official_packs_load_and_meet_the_size_bar():
    registry = PackRegistry.load()
    assert {"spinf/moderation", "spinf/support-triage", "spinf/product-reviews", "spinf/news-topics"} <= set(registry.ids())
    moderation = registry.get("spinf/moderation")
    assert len(moderation.questions) >= 20 and len(moderation.categories) >= 6
    for pack_id in registry.ids():
        assert expand_pack(registry.get(pack_id))


def test_registry_adds_extra_folders_and_names_an_unknown_pack(mini):
    registry = PackRegistry.load([mini.parent])
    assert "test/mini" in registry.ids() and "spinf/moderation" in registry.ids()
    with pytest.raises(UnknownPackError, match="spinf/nope"):
        registry.get("spinf/nope")


def test_registry_refuses_a_duplicate_id(mini, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "copy.yaml").write_text(mini.read_text())
    with pytest.raises(PackError, match="already loaded"):
        PackRegistry.load([mini.parent, other], include_official=False)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["questions"][1].update(options=[" yes"]), "questions[1] (id=mean)"),
        (lambda d: d["questions"][0].update(positive=[" maybe"]), "questions[0] (id=rude)"),
        (lambda d: d["categories"][0].update(questions=["rude", "ghost"]), "unknown id(s) ['ghost']"),
        (lambda d: d.update(version="one"), "version"),
        (lambda d: d["presentation"].update(template="no marker"), "presentation"),
        (lambda d: d["decisions"][0].pop("default"), "default"),
    ],
)
def test_a_malformed_pack_names_the_file_and_the_field(tmp_path, mini, edit, field):
    data = yaml.safe_load(mini.read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PackError) as error:
        load_pack(path)
    assert str(path) in str(error.value) and field in str(error.value)


def test_unreadable_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("id: [unclosed")
    with pytest.raises(PackError, match="broken.yaml"):
        load_pack(path)


def test_expand_pack_namespaces_ids_and_expands_orderings(mini):
    ids = [q.id for q in expand_pack(load_pack(mini))]
    assert ids == ["test/mini:rude", "test/mini:mean", "test/mini:kind", "test/mini:kind~o1"]


def test_apply_pack_scores_categories_and_decides(mini, mini_results):
    out = apply_pack(load_pack(mini), mini_results)
    assert out["questions"]["rude"]["p"] == pytest.approx(0.8)
    assert out["questions"]["rude"]["calibrated_p"] is None
    assert out["questions"]["kind"]["choices"] == pytest.approx({"warm": 0.6, "cold": 0.4})
    assert out["questions"]["kind"]["combined"]["agreement"] == 0.5
    assert out["questions"]["kind"]["p"] == pytest.approx(0.4)
    assert out["categories"]["hostile"]["score"] == pytest.approx((3 * 0.8 + 0.4) / 4)
    assert out["categories"]["harsh"]["score"] == pytest.approx(1 - 0.2 * 0.6)
    assert out["categories"]["chilly"]["score"] == pytest.approx(0.4)
    assert out["decisions"] == {"action": "block"}


def test_calibration_written_into_the_file_appears_beside_raw_values(mini, mini_results):
    fitted = PackCalibration(
        questions={"rude": Calibration(method="platt", params={"a": 1.0, "b": -3.0})},
        categories={"hostile": Calibration(method="temperature", params={"temperature": 2.0})},
    )
    pack = write_calibration(mini, fitted)
    text = mini.read_text()
    assert text.startswith("# a hand-written comment") and text.count("calibration:") == 1
    pack = write_calibration(mini, fitted)  # rewriting replaces, never appends
    assert mini.read_text() == text
    out = apply_pack(pack, mini_results)
    rude = out["questions"]["rude"]
    assert rude["p"] == pytest.approx(0.8)
    assert rude["calibrated_p"] == pytest.approx(1 / (1 + math.exp(-(math.log(4) - 3))))
    hostile = out["categories"]["hostile"]
    merged = (3 * rude["calibrated_p"] + 0.4) / 4
    z = math.log(merged / (1 - merged)) / 2.0
    assert hostile["calibrated_score"] == pytest.approx(1 / (1 + math.exp(-z)))
    assert out["decisions"]["action"] == ("block" if hostile["calibrated_score"] >= 0.5 else "allow")


def test_a_calibration_for_an_unknown_question_is_refused(mini):
    with pytest.raises(PackError, match="calibration"):
        write_calibration(mini, PackCalibration(questions={"ghost": Calibration(method="identity")}))


def test_a_category_map_that_reads_raw_scores_ignores_question_calibration(mini, mini_results):
    question_map = Calibration(method="platt", params={"a": 1.0, "b": -3.0})
    category_map = Calibration(method="temperature", params={"temperature": 1.0}, reads="raw")
    pack = write_calibration(mini, PackCalibration(questions={"rude": question_map}, categories={"hostile": category_map}))
    out = apply_pack(pack, mini_results)
    assert out["categories"]["hostile"]["calibrated_score"] == pytest.approx((3 * 0.8 + 0.4) / 4)
