"""Ship a training run's tiny weights: copy them into the package and update the card constants.

    python bench/ship_tiny.py RUN_DIR            # RUN_DIR: a bench/train_tiny.py --out (its last chunk)
    python bench/ship_tiny.py RUN_DIR --check    # only say what would change

Copies ``wan-tiny/{transformer,text_encoder,vae}.safetensors`` and
``wan-tiny-4step/transformer.safetensors`` (those the run has) into ``fastvideo3/weights/`` and
rewrites, in ``fastvideo3/models/wan/cards.py``, ``TINY_SHIPPED_DIT`` (the run's DiT config; the
seeded baseline card keeps ``TINY_DIT``),
``TINY_VAE_STATS``, ``TINY_GUIDANCE`` (from the run's ``train_log.json`` card update) and
``SHIPPED_DIGESTS`` (full-content sha256 of the shipped files). Refuses a file over 10 MB.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastvideo3.card.verify import file_digest  # noqa: E402

WEIGHTS = ROOT / "fastvideo3" / "weights"
REGISTRY = ROOT / "fastvideo3" / "models" / "wan" / "cards.py"
FILES = ("wan-tiny/text_encoder.safetensors", "wan-tiny/transformer.safetensors", "wan-tiny/vae.safetensors",
         "wan-tiny-4step/transformer.safetensors")
MAX_BYTES = 10_000_000


def fmt_dict(name: str, d: dict) -> str:
    items = [f"{k}={v!r}" for k, v in d.items()]
    lines, cur = [], "    "
    for it in items:
        if cur.strip() and len(cur) + len(it) + 2 > 100:
            lines.append(cur.rstrip())
            cur = "    "
        cur += it + ", "
    lines.append(cur.rstrip().rstrip(","))
    return f"{name} = dict(\n" + ",\n".join(line.rstrip(",") for line in lines) + ",\n)"


def replace_block(src: str, name: str, new: str) -> str:
    m = re.search(rf"^{name} = dict\(\n.*?^\)", src, flags=re.S | re.M)
    if not m:
        raise SystemExit(f"{name} not found in {REGISTRY}")
    return src[: m.start()] + new + src[m.end():]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    run = Path(a.run)
    upd = json.loads((run / "train_log.json").read_text())["card_update"]
    have = [rel for rel in FILES if (run / rel).exists()]
    for rel in have:
        n = (run / rel).stat().st_size
        if n > MAX_BYTES:
            raise SystemExit(f"{rel} is {n} bytes, over the {MAX_BYTES} byte limit of a shipped component")
    print("files:", ", ".join(have) or "none")
    src = REGISTRY.read_text()
    from fastvideo3.models.wan import cards as registry
    if "TINY_DIT" in upd:  # the shipped cards' DiT; the seeded baseline keeps TINY_DIT
        new = fmt_dict("TINY_SHIPPED_DIT", upd["TINY_DIT"])
        if re.search(r"^TINY_SHIPPED_DIT = dict\(TINY_DIT\)$", src, flags=re.M):
            src = re.sub(r"^TINY_SHIPPED_DIT = dict\(TINY_DIT\)$", lambda m: new, src, flags=re.M)
        else:
            src = replace_block(src, "TINY_SHIPPED_DIT", new)
    if "TINY_VAE_STATS" in upd and upd["TINY_VAE_STATS"] != registry.TINY_VAE_STATS:
        src = replace_block(src, "TINY_VAE_STATS", fmt_dict("TINY_VAE_STATS", upd["TINY_VAE_STATS"]))
    if "TINY_GUIDANCE" in upd:
        src = re.sub(r"^TINY_GUIDANCE = .*$", f"TINY_GUIDANCE = {float(upd['TINY_GUIDANCE'])!r}", src, flags=re.M)
    if a.check:
        print("card update:", json.dumps({k: v for k, v in upd.items() if k != "TINY_VAE_STATS"}))
        return 0
    for rel in have:
        (WEIGHTS / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run / rel, WEIGHTS / rel)
    digests = {rel: file_digest(WEIGHTS / rel) for rel in FILES}
    body = "SHIPPED_DIGESTS = {\n" + "".join(f'    "{k}":\n        "{v}",\n' for k, v in digests.items()) + "}"
    src = re.sub(r"^SHIPPED_DIGESTS = \{\n.*?^\}", body, src, flags=re.S | re.M)
    REGISTRY.write_text(src)
    print(f"updated {REGISTRY.relative_to(ROOT)}: TINY_SHIPPED_DIT, TINY_VAE_STATS, TINY_GUIDANCE, SHIPPED_DIGESTS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
