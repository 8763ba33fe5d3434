"""What every family's directory-layout check reads the same way (no torch: a layout is checked
before any weight is loaded)."""
from __future__ import annotations

import json
from pathlib import Path

from fastvideo3.errors import CardError


def json_mapping(path: Path, field: str) -> dict:
    """A diffusers folder's JSON file (``model_index.json``, a component's ``config.json``) as a
    mapping; CardError naming ``field`` when it is missing, not JSON or not a mapping."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CardError(f"{path.parent.name}/{path.name} is missing", field=field) from None
    except json.JSONDecodeError as e:
        raise CardError(f"{path.parent.name}/{path.name} is not valid JSON: {e}", field=field) from None
    if not isinstance(data, dict):
        raise CardError(f"{path.parent.name}/{path.name} must hold a mapping", field=field)
    return data
