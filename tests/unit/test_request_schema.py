"""Request validation against a card: every refusal names the field and the limit."""
import math

import pytest

from fastvideo3.card import get_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.request.schema import GenerateRequest, resolve

pytestmark = pytest.mark.timeout(30)
CARD = get_card("wan-tiny")


def test_defaults_come_from_the_card():
    r = resolve(GenerateRequest(prompt="a cat"), CARD)
    assert (r.num_frames, r.height, r.width) == (33, 128, 128)
    assert r.num_inference_steps == CARD.denoise.default_steps == 50
    assert r.sampler == "unipc" and r.flow_shift == 3.0
    assert r.cfg_policy == "batched" and r.guidance_scale == CARD.limits.default_guidance


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "x" * 5000}, "prompt"),
        ({"num_frames": 32}, "num_frames"),
        ({"num_frames": 0}, "num_frames"),
        ({"num_frames": 1001}, "num_frames"),
        ({"height": 100}, "height"),
        ({"width": 0}, "width"),
        ({"width": -16}, "width"),
        ({"height": 4096}, "height"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": -3}, "num_inference_steps"),
        ({"guidance_scale": math.nan}, "guidance_scale"),
        ({"guidance_scale": math.inf}, "guidance_scale"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"sampler": "ddim"}, "sampler"),
        ({"flow_shift": 0.0}, "flow_shift"),
        ({"cfg_policy": "weird"}, "cfg_policy"),
        ({"request_id": "bad id!"}, "request_id"),
        ({"slo_class": "gold"}, "slo_class"),
    ],
)
def test_bad_input_names_field(kw, field):
    kw = {"prompt": "a cat", **kw}
    with pytest.raises(InvalidRequest) as e:
        resolve(GenerateRequest(**kw), CARD)
    assert e.value.field == field
    assert e.value.code == "INVALID_ARGUMENT"
    assert field in e.value.one_line()


def test_guidance_at_most_one_disables_cfg():
    assert resolve(GenerateRequest(prompt="a", guidance_scale=1.0), CARD).cfg_policy == "none"
