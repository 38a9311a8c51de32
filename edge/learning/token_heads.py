"""Token adapter and distilled draft head: drafter features -> the target's next token.

Why: speculation pays only when the target accepts the drafts, and EventGPT's own tokens
match Video-LLaVA's 1.24-1.58% of the time (issue 22). Both networks here read the
drafter's last hidden state (after its final norm) at each position and predict the
token the *target* commits next, so drafting proposes their argmax and the cloud
verifies as before: greedy verification stays exactly lossless whatever proposes.

- :class:`TokenAdapter`: a two-layer MLP per position from the hidden state, as the
  seed work's 45M-parameter adapter (1.58% -> 27.9% top-1 on the real pair). It does
  not also read the drafter's logits: they are a linear map (the LM head) of this very
  hidden state, so they add cost per token and no information.
- :class:`DraftHead`: a feature-level head in the style of EAGLE (Li et al. 2024,
  "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"): each
  position's feature is fused with the embedding of the token fed there (the target's
  committed tokens, or the edge's own drafts beyond them), then one causal attention
  layer over the answer's positions so far, then the vocabulary projection. Trained by
  distillation from the target's committed outputs (DistillSpec: Zhou et al. 2024).

Both are small on purpose: their cost per draft token is reported next to the
drafter's (:func:`macs_per_token`) and must stay a fraction of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eventspec.shared.contract.errors import InvalidInput, NotFound

HeadKind = Literal["adapter", "head"]
HEAD_KINDS: tuple[HeadKind, ...] = ("adapter", "head")
CONFIG_FILE = "token_head.json"
WEIGHTS_FILE = "token_head.safetensors"


@dataclass(frozen=True)
class TokenHeadConfig:
    """What a token head reads and predicts; saved beside its weights."""

    kind: HeadKind
    #: The drafter's hidden size H.
    feature_dim: int
    #: The shared text vocabulary V (the target's ids below it mean the same text).
    text_vocab_size: int
    hidden: int = 128
    #: Head only: the width of its own token embeddings.
    token_dim: int = 64
    #: The drafter it was trained on: its model id and text-vocabulary fingerprint.
    draft_model_id: str = ""
    vocab_fingerprint: str = ""
    #: What it was trained on (scenes, requests, steps, ...): the model card's numbers.
    training: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise InvalidInput(f"token head kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        for name, value in (("hidden", self.hidden), ("feature_dim", self.feature_dim),
                            ("token_dim", self.token_dim)):
            if value < 1:
                raise InvalidInput(f"token head {name} must be >= 1, got {value}")
        if self.text_vocab_size < 2:
            raise InvalidInput(f"a text vocabulary of {self.text_vocab_size} ids is too small")


@dataclass
class HeadCache:
    """One request's head state: the positions seen so far (the head's keys, values)."""

    length: int = 0
    keys: torch.Tensor | None = None  # [n, d], head only
    values: torch.Tensor | None = None  # [n, d], head only

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (a rollback of the drafter's cache)."""
        if not 0 <= length <= self.length:
            raise InvalidInput(f"head cache crop to {length} outside 0..{self.length}")
        self.length = length
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[:length], self.values[:length]


class TokenAdapter(nn.Module):
    """LayerNorm -> Linear(H, d) -> GELU -> Linear(d, V), per position."""

    def __init__(self, config: TokenHeadConfig) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.feature_dim)
        self.up = nn.Linear(config.feature_dim, config.hidden)
        self.out = nn.Linear(config.hidden, config.text_vocab_size)

    def forward(self, feats: torch.Tensor, prev_tokens: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """feats [..., H] -> logits [..., V]; the tokens and mask are not needed."""
        logits: torch.Tensor = self.out(nn.functional.gelu(self.up(self.norm(feats))))
        return logits

    def step(self, cache: HeadCache, feats: torch.Tensor,
             prev_tokens: torch.Tensor) -> torch.Tensor:
        """k new positions: feats [k, H], tokens [k] -> logits [k, V]."""
        cache.length += feats.shape[0]
        logits: torch.Tensor = self(feats, prev_tokens)
        return logits


class DraftHead(nn.Module):
    """EAGLE-style head: fuse(feature, token embedding) -> causal attention -> vocab.

    ``prev_tokens`` are the tokens fed at each position: at the first answer position
    (after the prompt) none was, and the id ``text_vocab_size`` stands for "answer start".
    """

    def __init__(self, config: TokenHeadConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden
        self.embed = nn.Embedding(config.text_vocab_size + 1, config.token_dim)
        self.feat_norm = nn.LayerNorm(config.feature_dim)
        self.fuse = nn.Linear(config.feature_dim + config.token_dim, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.out_norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, config.text_vocab_size)

    def _inputs(self, feats: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """feats [..., H], tokens [...] -> fused inputs [..., d]."""
        tok = self.embed(prev_tokens)  # [..., e]
        fused: torch.Tensor = nn.functional.gelu(
            self.fuse(torch.cat([self.feat_norm(feats), tok], dim=-1)))
        return fused

    def forward(self, feats: torch.Tensor, prev_tokens: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Whole answers at once (training): feats [B, n, H], tokens [B, n], mask [B, n]
        (1 = real position, right-padded) -> logits [B, n, V]."""
        z = self._inputs(feats, prev_tokens)  # [B, n, d]
        q, k, v = self.qkv(z).chunk(3, dim=-1)  # [B, n, d] each
        n = z.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=z.device).tril()  # [n, n]
        if mask is not None:
            allowed = allowed & mask.bool()[:, None, :]  # [B, n, n]
        att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        y = z + self.proj(att)  # [B, n, d]
        logits: torch.Tensor = self.out(self.out_norm(y))
        return logits

    def step(self, cache: HeadCache, feats: torch.Tensor,
             prev_tokens: torch.Tensor) -> torch.Tensor:
        """k new positions after ``cache``: feats [k, H], tokens [k] -> logits [k, V].

        One layer, so a position's key and value depend on its own input only: the
        cache is those rows, and a rollback is a crop.
        """
        z = self._inputs(feats, prev_tokens)  # [k, d]
        q, k, v = self.qkv(z).chunk(3, dim=-1)  # [k, d] each
        keys = k if cache.keys is None else torch.cat([cache.keys, k])  # [n + k, d]
        values = v if cache.values is None else torch.cat([cache.values, v])
        n, new = cache.length, z.shape[0]
        allowed = torch.ones(new, n + new, dtype=torch.bool, device=z.device).tril(n)
        att = nn.functional.scaled_dot_product_attention(
            q[None], keys[None], values[None], attn_mask=allowed[None])[0]  # [k, d]
        cache.keys, cache.values, cache.length = keys, values, n + new
        logits: torch.Tensor = self.out(self.out_norm(z + self.proj(att)))
        return logits


TokenHead = TokenAdapter | DraftHead


def build_head(config: TokenHeadConfig) -> TokenHead:
    """A fresh (untrained) adapter or head for ``config``."""
    return TokenAdapter(config) if config.kind == "adapter" else DraftHead(config)


def macs_per_token(head: TokenHead) -> int:
    """Multiply-accumulates per drafted token: every weight matrix once (the head's
    attention over n answer positions adds 2·n·d, negligible for short answers)."""
    return sum(m.weight.numel() for m in head.modules() if isinstance(m, nn.Linear))


def drafter_macs_per_token(model: nn.Module) -> int:
    """The drafter's decoder layers and LM head per token (its vision path runs once
    per request, not per token)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    lm_head = getattr(model, "lm_head", None)
    if not isinstance(layers, nn.Module) or not isinstance(lm_head, nn.Linear):
        raise InvalidInput("expected a causal LM with model.layers and lm_head")
    linear = sum(m.weight.numel() for m in layers.modules() if isinstance(m, nn.Linear))
    return linear + lm_head.weight.numel()


def save_head(head: TokenHead, out: Path, card: str) -> Path:
    """Write ``token_head.json``, the weights and the model card (``README.md``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(asdict(head.config), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()},
              str(out / WEIGHTS_FILE))
    (out / "README.md").write_text(card)
    return out


def load_head(path: Path, device: str | torch.device = "cpu") -> TokenHead:
    """A directory written by :func:`save_head` (``eventspec-edge train-adapter``)."""
    if not (path / CONFIG_FILE).is_file():
        raise NotFound(f"no token adapter or draft head at {path} ({CONFIG_FILE} missing)")
    raw = json.loads((path / CONFIG_FILE).read_text())
    config = TokenHeadConfig(**raw)
    head = build_head(config)
    state = load_file(str(path / WEIGHTS_FILE))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InvalidInput(f"{path}: missing {list(missing)[:5]}, unexpected "
                           f"{list(unexpected)[:5]} weights")
    head.eval()
    return head.to(device)

