"""The ``fastvideo3`` command.

    fastvideo3 generate "PROMPT" -o out.mp4 [--model --steps --frames --size WxH --seed ...]
    fastvideo3 cards | card show NAME | card validate FILE
    fastvideo3 serve ... | client generate ... | deployment-card ... | slo report TRACES.json

Bad input exits with status 2 and one line naming the field and the allowed range; nothing is
written for a refused request.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fastvideo3.cli_args import EXIT_BAD_INPUT, _float, _Parser, _size
from fastvideo3.errors import FastVideoError, InvalidRequest
from fastvideo3.vocab import EventKind

EXIT_FAILED = 1
_BAD_INPUT_CODES = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastvideo3", description="Serve and generate videos with video diffusion models.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate a video in this process (embedded mode)")
    g.add_argument("prompt")
    g.add_argument("-o", "--output", required=True, help="out.mp4 (H.264), out.npy (float32 frames) or a directory (PNGs)")
    g.add_argument("--model", default="wan-tiny", help="a card name, a card file or a diffusers-format directory")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (card default)")
    g.add_argument("--frames", type=int, default=None, help="number of frames, 4k+1 (card default)")
    g.add_argument("--size", type=_size, default=None, help="WIDTHxHEIGHT, multiples of 16 (card default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--guidance", type=_float, default=None, help="classifier-free guidance scale (card default)")
    g.add_argument("--guidance-2", type=_float, default=None, dest="guidance_2",
                   help="two-expert cards: the low-noise expert's guidance (guidance_scale_2; default --guidance)")
    g.add_argument("--negative-prompt", default=None)
    g.add_argument("--image", default=None, metavar="PATH",
                   help="image-to-video cards: the first frame (a PNG, JPEG or WebP file)")
    g.add_argument("--sampler", default=None, help="unipc or euler (card default)")
    g.add_argument("--flow-shift", type=_float, default=None)
    g.add_argument("--cfg-policy", default=None, help="none, classic or batched")
    g.add_argument("--device", default=None, help="cpu or cuda (auto)")
    g.add_argument("--precision", default=None, help="fp32, bf16, fp8_e4m3 (the card's default for the device)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("cards", help="list the built-in cards")
    c = sub.add_parser("card", help="show or validate a card")
    csub = c.add_subparsers(dest="card_cmd", required=True, parser_class=_Parser)
    cs = csub.add_parser("show")
    cs.add_argument("name")
    cs.add_argument("--format", choices=("yaml", "json"), default="yaml")
    cv = csub.add_parser("validate")
    cv.add_argument("file")

    from fastvideo3 import cli_fleet
    cli_fleet.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "generate":
            return cmd_generate(args)
        if args.cmd == "cards":
            return cmd_cards()
        if args.cmd == "card":
            return cmd_card(args)
        from fastvideo3 import cli_fleet
        return cli_fleet.run(args)
    except FastVideoError as e:
        print(f"fastvideo3: error: {e.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT if e.code in _BAD_INPUT_CODES else EXIT_FAILED
    except KeyboardInterrupt:
        print("fastvideo3: interrupted", file=sys.stderr)
        return 130


def _check_output(path: str) -> Path:
    p = Path(path)
    if p.suffix.lower() not in (".mp4", ".npy", "") and not (p.exists() and p.is_dir()):
        raise InvalidRequest(f"unsupported output {path!r}", field="output", limit=".mp4, .npy or a directory")
    parent = p.parent if p.suffix else p
    if parent.exists() and not parent.is_dir():
        raise InvalidRequest(f"{parent} is not a directory", field="output")
    return p


def cmd_generate(args) -> int:
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.request.schema import GenerateRequest, resolve

    out = _check_output(args.output)
    card = resolve_card(args.model)
    if args.precision is not None and args.precision not in card.precision.supported:
        raise InvalidRequest(f"unsupported precision {args.precision!r}", field="precision",
                             limit=", ".join(card.precision.supported))
    device = args.device
    if device is not None and device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InvalidRequest(f"unknown device {device!r}", field="device", limit="cpu, cuda, cuda:N")
    width, height = args.size if args.size else (None, None)
    kw = dict(negative_prompt=args.negative_prompt, num_frames=args.frames, height=height, width=width,
              num_inference_steps=args.steps, guidance_scale=args.guidance, guidance_scale_2=args.guidance_2,
              seed=args.seed, flow_shift=args.flow_shift, sampler=args.sampler, cfg_policy=args.cfg_policy)
    if args.image is not None:
        try:
            kw["image"] = Path(args.image).read_bytes()
        except OSError as e:
            raise InvalidRequest(f"cannot read {args.image}: {e.strerror}", field="image") from None
    # validate everything before any weight loads: a refused request writes nothing
    import torch
    on_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    precision = args.precision or (card.precision.default_cuda if on_cuda else card.precision.default_cpu)
    resolve(GenerateRequest(prompt=args.prompt, **kw), card, precision=precision)

    from fastvideo3.engine import Engine
    t0 = time.perf_counter()
    engine = Engine(card, device=device, precision=precision)
    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=0, desc="denoise", unit="step", file=sys.stderr, leave=False)

    def on_event(ev):
        if bar is not None and ev.kind == EventKind.PROGRESS and ev.data.get("phase") == "denoise":
            bar.total = ev.data["total"]
            bar.n = ev.data["step"]
            bar.refresh()

    try:
        video = engine.generate(args.prompt, on_event=on_event, **kw)
    finally:
        if bar is not None:
            bar.close()
        engine.close()
    video.metadata["timings_s"]["load"] = round(engine.load_seconds, 4)
    video.metadata["timings_s"]["total"] = round(time.perf_counter() - t0, 4)
    written = video.save(out)
    f, h, w, _ = video.frames.shape
    print(f"wrote {written[0]} ({f} frames, {w}x{h}, {video.metadata['timings_s']['total']:.1f}s)")
    if len(written) > 1:
        print(f"provenance: {written[1]}")
    return 0


def cmd_cards() -> int:
    from fastvideo3.card.registry import builtin_cards
    for name, card in builtin_cards().items():
        steps = card.recipe.assumes_steps or card.denoise.default_steps
        print(f"{name:20s} {card.family:5s} steps={steps:<3} {card.description}")
    return 0


def cmd_card(args) -> int:
    from fastvideo3.card.registry import get_card, load_card_file
    if args.card_cmd == "show":
        card = get_card(args.name) if not Path(args.name).exists() else load_card_file(args.name)
        data = card.model_dump(mode="json")
        if args.format == "json":
            print(json.dumps(data, indent=2))
        else:
            import yaml
            print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    card = load_card_file(args.file)
    print(f"ok: {card.model_id} ({card.family}, recipe {card.recipe.method}, loops: {', '.join(card.loops)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
