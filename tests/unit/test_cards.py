"""Card validation, the registry, card files and the recipe's teeth."""
import pytest
import yaml

from fastvideo3.card import ModelCard, builtin_cards, get_card, load_card_file
from fastvideo3.errors import CardError, NotFound, RecipeMismatch
from fastvideo3.request.schema import GenerateRequest, resolve

pytestmark = pytest.mark.timeout(30)


def test_registry_has_the_builtin_cards():
    cards = builtin_cards()
    assert {"wan-tiny", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"} <= set(cards)
    assert cards["wan2.1-t2v-1.3b"].components["transformer"].config["num_layers"] == 30
    assert cards["wan2.1-t2v-14b"].components["transformer"].config["num_attention_heads"] == 40
    assert cards["wan-tiny"].checkpoint.root is None


def test_unknown_card_names_the_field():
    with pytest.raises(NotFound) as e:
        get_card("nope")
    assert e.value.field == "model" and "wan-tiny" in e.value.limit


def test_card_round_trips_through_json():
    card = get_card("wan-tiny")
    again = ModelCard.model_validate_json(card.model_dump_json())
    assert again == card


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"recipe": {"assumes_loop": "ar_decode"}}, "recipe"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"limits": {"default_frames": 32}}, "default_frames"),
        ({"loops": {"diffusion_denoise": {"loop_id": "diffusion_denoise", "min_steps": 10, "max_steps": 5}}}, "min_steps"),
        ({"checkpoint": {"required_for": {"text_to_video": ["transformer", "ghost"]}}}, "ghost"),
        ({"model_id": "bad id with spaces"}, "model_id"),
    ],
)
def test_invalid_cards_are_refused_naming_the_problem(tmp_path, patch, field):
    data = get_card("wan-tiny").model_dump(mode="json")
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CardError) as e:
        load_card_file(path)
    assert field in (e.value.field or "") + e.value.message


def test_card_file_can_extend_a_builtin(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("extends: wan-tiny\nmodel_id: my-tiny\nlimits: {max_frames: 41}\n")
    card = load_card_file(path)
    assert card.model_id == "my-tiny" and card.limits.max_frames == 41
    assert card.components == get_card("wan-tiny").components


def test_unreadable_card_files(tmp_path):
    with pytest.raises(CardError):
        load_card_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(CardError):
        load_card_file(bad)


def _distilled(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(
        "extends: wan-tiny\nmodel_id: tiny-4step\n"
        "recipe: {method: step_distill, assumes_steps: 4, assumes_sampler: euler, parents: [wan-tiny]}\n"
    )
    return load_card_file(path)


def test_recipe_refuses_other_step_counts(tmp_path):
    card = _distilled(tmp_path)
    ok = resolve(GenerateRequest(prompt="x", sampler="euler"), card)
    assert ok.num_inference_steps == 4
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt="x", num_inference_steps=50, sampler="euler"), card)
    assert e.value.code == "FAILED_PRECONDITION" and e.value.field == "num_inference_steps"
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt="x", num_inference_steps=4, sampler="unipc"), card)
    assert e.value.field == "sampler"


def test_recipe_refuses_other_precision(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("extends: wan-tiny\nmodel_id: q\nrecipe: {method: qat, assumes_precision: bf16}\n")
    card = load_card_file(path)
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt="x"), card, precision="fp32")
    assert e.value.field == "precision"
    assert resolve(GenerateRequest(prompt="x"), card, precision="bf16").precision == "bf16"
