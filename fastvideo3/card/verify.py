"""Start-up check of a card's weight files: every file a role loads is present, and every file
the CheckpointManifest (or the operator's digest file) gives a digest for hashes to it.

A pool runs :func:`verify_checkpoint` before it loads anything, so a missing or corrupt volume
fails in seconds with the file named, instead of deep inside a loader. Paths are relative to the
weights root: ``checkpoint.root`` when set, else the package's ``fastvideo3/weights`` (shipped
components). Digests are full-content ``sha256:<64 hex>``.

    python -m fastvideo3.card.verify --card wan2.1-t2v-1.3b --checkpoint-root /models/wan --print-digests
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import yaml

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import CardError
from fastvideo3.vocab import Role

#: the component kinds each role pool loads (the reward pool's scorers ship in code)
ROLE_KINDS: dict[str, frozenset[str]] = {
    Role.ENCODER: frozenset({"text_encoder", "tokenizer"}),
    Role.DENOISER: frozenset({"dit", "scheduler"}),
    Role.DECODER: frozenset({"vae"}),
    Role.REWARD: frozenset(),
}
ALL_KINDS = frozenset().union(*ROLE_KINDS.values())
_CONFIG_FILE = {"scheduler": "scheduler_config.json", "tokenizer": None}
_CHUNK = 1 << 20


def weights_root(card: ModelCard) -> Path:
    """The directory relative paths of the manifest are taken from."""
    if card.checkpoint.root:
        return Path(card.checkpoint.root)
    from fastvideo3.card.family import family_of
    return family_of(card).weights_dir()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def component_files(card: ModelCard, kinds: frozenset[str] = ALL_KINDS) -> list[str]:
    """Relative paths of the files the components of ``kinds`` load (presence is required)."""
    root = weights_root(card)
    out: list[str] = []
    for cid, spec in card.components.items():
        if spec.kind not in kinds or spec.source == "seeded":
            continue
        if spec.source == "shipped":
            out.append(spec.subfolder or f"{cid}.safetensors")
            continue
        if not card.checkpoint.root:
            raise CardError(f"card {card.model_id} loads {cid} from a checkpoint directory and none was given "
                            "(--checkpoint-root or the card file's checkpoint.root)", field="checkpoint.root")
        sub = spec.subfolder or cid
        folder = root / sub
        if not folder.is_dir():
            out.append(f"{sub}/")  # reported as missing: the whole component directory
            continue
        config = _CONFIG_FILE.get(spec.kind, "config.json")
        if config:
            out.append(f"{sub}/{config}")
        if spec.kind in ("dit", "vae", "text_encoder"):
            index = sorted(folder.glob("*.safetensors.index.json"))
            if index:
                out.append(f"{sub}/{index[0].name}")
                try:
                    shards = sorted(set(json.loads(index[0].read_text())["weight_map"].values()))
                except (OSError, ValueError, KeyError) as e:
                    raise CardError(f"checkpoint file {sub}/{index[0].name} is unreadable: {e}",
                                    field=f"checkpoint.{sub}/{index[0].name}") from None
                out += [f"{sub}/{s}" for s in shards]
            else:
                files = sorted(folder.glob("*.safetensors"))
                out += [f"{sub}/{p.name}" for p in files] or [f"{sub}/*.safetensors"]
        elif spec.kind == "tokenizer" and not any(folder.iterdir()):
            out.append(f"{sub}/tokenizer_config.json")
    return out


def _role_paths(card: ModelCard, kinds: frozenset[str]) -> set[str]:
    """Shipped files and component directories (``sub/``) of the components of ``kinds``."""
    out = set()
    for cid, spec in card.components.items():
        if spec.kind in kinds and spec.source == "shipped":
            out.add(spec.subfolder or f"{cid}.safetensors")
        elif spec.kind in kinds and spec.source == "diffusers_dir":
            out.add(f"{spec.subfolder or cid}/")
    return out


def verify_checkpoint(card: ModelCard, kinds: frozenset[str] = ALL_KINDS,
                      extra_digests: dict[str, str] | None = None) -> dict[str, str]:
    """Check presence and digests of the files the components of ``kinds`` load; returns
    {relative path: digest} of the files hashed.

    Raises :class:`CardError` naming the first missing or mismatched file (``field`` is
    ``checkpoint.<relative path>``). ``extra_digests`` (the operator's) win over the card's."""
    root = weights_root(card)
    digests = {**card.checkpoint.digests, **(extra_digests or {})}
    needed = component_files(card, kinds)
    # a digest names a file of this role when it is one of its files or lies in one of its
    # component directories: such a file must be present even when no listing found it (a
    # deleted single shard); files of other roles are not this pod's business (no hashing
    # of a text encoder in a denoiser pod)
    mine = _role_paths(card, kinds)
    ours = sorted(p for p in digests
                  if p in needed or p in mine or any(p.startswith(d) for d in mine if d.endswith("/")))
    missing_dirs = [p for p in needed if p.endswith("/")]  # reported first: the whole component is absent
    wanted = missing_dirs + ours + [p for p in needed if p not in digests and p not in missing_dirs and not (
        "*" in p and any(o.startswith(p.split("*")[0]) for o in ours))]
    checked: dict[str, str] = {}
    for rel in wanted:
        path = root / rel
        if rel.endswith("/") or "*" in rel or not path.is_file():
            what = "directory" if rel.endswith("/") else "file"
            raise CardError(f"checkpoint {what} {rel} is missing under {root}", field=f"checkpoint.{rel}")
        if rel in digests:
            got = file_digest(path)
            if got != digests[rel]:
                raise CardError(f"checkpoint file {rel} under {root} has digest {got[:19]}..., "
                                f"the manifest says {digests[rel][:19]}...", field=f"checkpoint.{rel}",
                                limit=digests[rel])
            checked[rel] = got
    return checked


def load_digest_file(path: str | Path, card_id: str) -> dict[str, str]:
    """The operator's digests for one card from a YAML/JSON file ``{card_id: {path: digest}}``."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CardError(f"cannot read checkpoint digests file {path}: {e}", field="checkpoint_digests") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CardError("checkpoint digests file must map card -> {path: sha256:HEX}", field="checkpoint_digests")
    entry = {str(k): str(v) for k, v in (data.get(card_id) or {}).items()}
    from fastvideo3.card.spec import check_digests
    try:
        check_digests(entry)
    except ValueError as e:
        raise CardError(str(e), field=f"checkpoint_digests.{card_id}") from None
    return entry


def main(argv: list[str] | None = None) -> int:
    from fastvideo3.card.registry import bind_checkpoint, resolve_card
    p = argparse.ArgumentParser(prog="python -m fastvideo3.card.verify", description=__doc__.splitlines()[0])
    p.add_argument("--card", required=True)
    p.add_argument("--checkpoint-root", default=None)
    p.add_argument("--role", default=None, choices=sorted(ROLE_KINDS), help="only what this role loads")
    p.add_argument("--print-digests", action="store_true", help="print {card: {path: digest}} of every file")
    a = p.parse_args(argv)
    card = resolve_card(a.card)
    if a.checkpoint_root:
        card = bind_checkpoint(card, a.checkpoint_root)
    kinds = ROLE_KINDS[a.role] if a.role else ALL_KINDS
    try:
        if a.print_digests:
            root = weights_root(card)
            files = component_files(card, kinds)
            missing = [f for f in files if f.endswith("/") or "*" in f or not (root / f).is_file()]
            if missing:
                raise CardError(f"checkpoint file {missing[0]} is missing under {root}",
                                field=f"checkpoint.{missing[0]}")
            print(yaml.safe_dump({card.model_id: {f: file_digest(root / f) for f in files}}, sort_keys=True), end="")
        else:
            checked = verify_checkpoint(card, kinds)
            print(f"{card.model_id}: {len(component_files(card, kinds))} files present, {len(checked)} digests match")
    except CardError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
