"""The CLI surface: bad input exits 2 with one line naming the field, and writes nothing."""
import subprocess
import sys

import pytest

from fastvideo3.cli import build_parser, main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "args, field",
    [
        (["--frames", "32"], "num_frames"),
        (["--frames", "0"], "num_frames"),
        (["--size", "100x128"], "width"),
        (["--size", "128x0"], "height"),
        (["--size", "big"], "size"),
        (["--steps", "0"], "num_inference_steps"),
        (["--steps", "-5"], "num_inference_steps"),
        (["--model", "no-such-card"], "model"),
        (["--guidance", "nan"], "guidance_scale"),
        (["--seed", "-1"], "seed"),
        (["--sampler", "ddim"], "sampler"),
        (["--precision", "int3"], "precision"),
        (["--device", "tpu"], "device"),
        (["-o", "{out}/video.gif"], "output"),
        (["--prompt-empty"], "prompt"),
        (["--image", "{out}/first.png"], "image"),  # unreadable
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, field):
    out = tmp_path / "out"
    prompt = "a cat"
    if args == ["--prompt-empty"]:
        prompt, args = "", []
    argv = ["generate", prompt, "-o", str(out / "v.mp4"), *[a.format(out=out) for a in args]]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert field in err[0]
    assert not out.exists(), "a refused request wrote something"


def test_cli_process_exit_status_and_cards(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastvideo3.cli", "generate", "x", "-o", str(tmp_path / "a.mp4"),
                        "--frames", "6"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "num_frames" in r.stderr and "4k+1" in r.stderr
    assert not (tmp_path / "a.mp4").exists()
    r = subprocess.run([sys.executable, "-m", "fastvideo3.cli", "cards"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "wan-tiny" in r.stdout and "wan2.1-t2v-14b" in r.stdout


def test_card_show_and_validate(tmp_path, capsys):
    assert main(["card", "show", "wan-tiny", "--format", "json"]) == 0
    import json
    shown = json.loads(capsys.readouterr().out)
    assert shown["model_id"] == "wan-tiny"
    assert main(["card", "show", "wan-tiny"]) == 0
    yaml_text = capsys.readouterr().out
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    assert main(["card", "validate", str(f)]) == 0
    assert "ok: wan-tiny" in capsys.readouterr().out
    f.write_text(yaml_text.replace("default_frames: 33", "default_frames: 30"))
    assert main(["card", "validate", str(f)]) == 2
    assert "default_frames" in capsys.readouterr().err


def test_cli_surface_is_frozen():
    """The documented flags of `generate` exist (a rename is a breaking change)."""
    p = build_parser()
    gen = p._subparsers._group_actions[0].choices["generate"]
    flags = {s for a in gen._actions for s in a.option_strings}
    assert {"-o", "--model", "--steps", "--frames", "--size", "--seed", "--guidance", "--negative-prompt"} <= flags


def test_image_flag_on_a_text_to_video_card_is_refused(tmp_path, capsys):
    from PIL import Image
    img = tmp_path / "first.png"
    Image.new("RGB", (128, 128)).save(img)
    assert main(["generate", "a cat", "-o", str(tmp_path / "o" / "v.mp4"), "--image", str(img)]) == 2
    err = capsys.readouterr().err.strip()
    assert "image" in err and "text-to-video" in err
    assert not (tmp_path / "o").exists()


def test_serve_scheduler_replicas_need_a_shared_store(capsys):
    assert main(["serve", "--schedulers", "2", "--fake"]) != 0  # refused before anything starts
    assert "schedulers" in capsys.readouterr().err
    assert main(["serve", "--schedulers", "0", "--fake"]) != 0
    assert "schedulers: 0 is out of range" in capsys.readouterr().err
