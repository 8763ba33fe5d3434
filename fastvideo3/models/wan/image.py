"""Wan2.1 image-to-video conditioning: the CLIP image encoder and the first-frame image latent.

Two things condition an I2V denoise on the request's image, both computed once per request:

- **image embeddings** (encoder pool): the image through the directory's ``CLIPImageProcessor``
  (resize, center crop, normalise) and its ``CLIPVisionModel`` (or ``...WithProjection``: the
  projection is never used); the penultimate layer's hidden states ``[1, T_img, image_dim]`` are
  what the DiT's image cross-attention reads, as diffusers' ``WanImageToVideoPipeline`` uses them.
- **the image latent** (decoder pool, unit kind ``vae_encode``): the image resized to the
  request's size (Lanczos, as diffusers' ``VideoProcessor``), in ``[-1, 1]``, followed by
  ``num_frames - 1`` zero frames, through the VAE's encoder (the distribution's mode), normalised
  by the VAE's latent statistics, after a 4-channel mask that is 1 on the first latent frame:
  ``[1, 4 + z_dim, F_lat, H_lat, W_lat]``, concatenated to the noisy latent at every step.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import CardError
from fastvideo3.models.checkpoint import safetensors_files, weights_digest

#: the image encoder classes the layout implements (their vision towers are the same modules)
IMAGE_ENCODER_CLASSES = ("CLIPVisionModel", "CLIPVisionModelWithProjection")
#: the mask channels before the image latent (1 on the first latent frame, 0 elsewhere)
MASK_CHANNELS = 4


def open_rgb(data: bytes):
    """The request's image bytes as an RGB PIL image (validated already: fastvideo3.request.image)."""
    from PIL import Image
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB") if img.mode != "RGB" else img


def vae_pixels(image, height: int, width: int) -> torch.Tensor:
    """``[1, 3, H, W]`` float32 in ``[-1, 1]``: the image resized to the request's size with
    Lanczos, exactly as diffusers' ``VideoProcessor.preprocess`` does (its default resize mode)."""
    from PIL import Image
    resized = image.resize((width, height), resample=Image.LANCZOS)
    arr = np.asarray(resized, dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0).mul(2.0).sub(1.0).contiguous()


def first_frame_mask(latent_frames: int, height: int, width: int) -> torch.Tensor:
    """``[1, 4, F_lat, H_lat, W_lat]``: diffusers' ``mask_lat_size`` (frame 0 repeated 4x, then
    viewed as 4 channels per latent frame), which is 1 on latent frame 0 and 0 elsewhere."""
    mask = torch.zeros(1, MASK_CHANNELS, latent_frames, height, width)
    mask[:, :, 0] = 1.0
    return mask


class ImageEncoder:
    """images -> ``[B, T_img, image_dim]`` penultimate CLIP hidden states."""

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32):
        import transformers
        from transformers import CLIPImageProcessor
        root = card.checkpoint.root
        if not root:
            raise CardError(f"card {card.model_id} loads its image encoder from a checkpoint directory; none was "
                            "given (pass --model DIR)", field="checkpoint.root")
        enc_dir = Path(root) / (card.components["image_encoder"].subfolder or "image_encoder")
        proc_dir = Path(root) / (card.components["image_processor"].subfolder or "image_processor")
        for sub, d in (("image_encoder", enc_dir), ("image_processor", proc_dir)):
            if not d.is_dir():
                raise CardError(f"checkpoint directory lacks {sub}/", field=f"checkpoint.{sub}")
        cfg = json.loads((enc_dir / "config.json").read_text())
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in IMAGE_ENCODER_CLASSES:
            raise CardError(f"image_encoder/config.json is a {arch}; the layout implements "
                            f"{' or '.join(IMAGE_ENCODER_CLASSES)}", field="components.image_encoder.config.architectures",
                            limit=", ".join(IMAGE_ENCODER_CLASSES))
        dit_dim = card.components["transformer"].config.get("image_dim")
        if cfg.get("hidden_size") != dit_dim:
            raise CardError(f"image_encoder hidden_size={cfg.get('hidden_size')} but the DiT's image_dim is {dit_dim}",
                            field="components.image_encoder.config.hidden_size", limit=str(dit_dim))
        files = safetensors_files(enc_dir)
        self.model, info = getattr(transformers, arch).from_pretrained(str(enc_dir), local_files_only=True, dtype=dtype,
                                                                       output_loading_info=True)
        _check_loading(info)
        self.processor = CLIPImageProcessor.from_pretrained(str(proc_dir), local_files_only=True)
        self.model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.device, self.dtype = device, dtype
        self.digest = weights_digest(files)
        self.dim = int(cfg["hidden_size"])

    @torch.no_grad()
    def encode(self, images: list) -> torch.Tensor:
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        out = self.model(pixel_values=pixels.to(self.device, self.dtype), output_hidden_states=True)
        return out.hidden_states[-2]


def _check_loading(info: dict) -> None:
    """Refuse an image encoder whose files lack tensors its class has, hold ones it does not, or
    hold them at another shape (from_pretrained would only warn), naming one."""
    for what, key in (("lacks", "missing_keys"), ("has tensors its class does not know,", "unexpected_keys"),
                      ("has mis-shaped tensors,", "mismatched_keys")):
        bad = sorted(str(k) for k in (info.get(key) or []))
        if bad:
            raise CardError(f"image_encoder {what} {len(bad)} tensor(s), e.g. {bad[0]}", field="image_encoder")


@torch.no_grad()
def encode_condition(vae_model: torch.nn.Module, mean: torch.Tensor, inv_std: torch.Tensor, pixels: torch.Tensor,
                     num_frames: int) -> torch.Tensor:
    """The image latent conditioning ``[1, 4 + z_dim, F_lat, H_lat, W_lat]`` from ``pixels``
    ``[1, 3, H, W]`` in ``[-1, 1]`` (see the module docstring)."""
    param = next(vae_model.parameters())
    _, _, h, w = pixels.shape
    video = torch.cat([pixels.unsqueeze(2), pixels.new_zeros(1, 3, num_frames - 1, h, w)], dim=2)
    latent = vae_model.encode(video.to(param.device, param.dtype)).latent_dist.mode().float()
    latent = (latent - mean.to(latent)) * inv_std.to(latent)
    mask = first_frame_mask(latent.shape[2], latent.shape[3], latent.shape[4]).to(latent)
    return torch.cat([mask, latent], dim=1)
