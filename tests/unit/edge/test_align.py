"""Feature adapter: geometry, identity-ish init, save/load, mismatch errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eventspec.edge.vision.align import (
    AdapterConfig,
    FeatureAdapter,
    build_adapter_for,
    check_geometry,
    load_adapter,
    save_adapter,
)
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

SRC, DST = (5, 1 + 6 * 6, 16), (8, 1 + 4 * 4, 24)


def test_output_shape_batched_and_not() -> None:
    adapter = build_adapter_for(SRC, DST, seed=0)
    x = torch.randn(*SRC)
    assert adapter(x).shape == DST
    assert adapter(torch.randn(2, *SRC)).shape == (2, *DST)
    with pytest.raises(InvalidInput, match="expects features"):
        adapter(torch.randn(5, 36, 16))


def test_real_geometry_shapes() -> None:
    adapter = build_adapter_for((5, 577, 64), (8, 257, 64), seed=0, hidden=32)
    assert adapter(torch.randn(5, 577, 64)).shape == (8, 257, 64)


def test_untrained_adapter_with_equal_geometry_is_identity() -> None:
    adapter = build_adapter_for((5, 10, 8), (5, 10, 8), seed=1)
    x = torch.randn(5, 10, 8)
    torch.testing.assert_close(adapter(x), x)


def test_resampling_keeps_cls_and_interpolates_time() -> None:
    adapter = build_adapter_for((2, 1 + 4, 8), (3, 1 + 1, 8), seed=2)
    x = torch.randn(2, 5, 8)
    y = adapter(x)
    # CLS: not mixed with patches; middle frame is the average of the two ends
    torch.testing.assert_close(y[0, 0], x[0, 0])
    torch.testing.assert_close(y[2, 0], x[1, 0])
    torch.testing.assert_close(y[1, 0], (x[0, 0] + x[1, 0]) / 2)
    # the 2x2 grid shrunk to 1x1 is its mean (antialiased bilinear)
    torch.testing.assert_close(y[0, 1], x[0, 1:].mean(dim=0))


def test_config_validation() -> None:
    with pytest.raises(InvalidInput, match="square"):
        AdapterConfig(5, 11, 8, 8, 17, 8, 8)
    with pytest.raises(InvalidInput, match="positive"):
        AdapterConfig(0, 5, 8, 8, 17, 8, 8)


def test_save_load_round_trip(tmp_path: Path) -> None:
    adapter = build_adapter_for(SRC, DST, seed=3)
    with torch.no_grad():
        for p in adapter.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # as if trained
    save_adapter(adapter, tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, FeatureAdapter) and loaded.config == adapter.config
    x = torch.randn(*SRC)
    torch.testing.assert_close(loaded(x), adapter(x), rtol=0, atol=0)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        load_adapter(tmp_path / "none")
    save_adapter(build_adapter_for(SRC, DST), tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    cfg["dst_dim"] = 32  # weights were made for 24
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidInput, match="do not match its config"):
        load_adapter(tmp_path)


def test_check_geometry() -> None:
    adapter = build_adapter_for(SRC, DST)
    check_geometry(adapter, DST)
    with pytest.raises(FailedPrecondition, match=r"produces \[8, 17, 24\], but the cloud "
                       r"expects \[8, 257, 1024\]"):
        check_geometry(adapter, (8, 257, 1024))


def test_mixer_adapter_starts_as_the_plain_adapter_and_round_trips(tmp_path) -> None:
    import torch

    from eventspec.edge.vision.align import build_adapter_for, load_adapter, save_adapter

    plain = build_adapter_for((5, 17, 32), (8, 5, 48), seed=3)
    mixed = build_adapter_for((5, 17, 32), (8, 5, 48), seed=3, mixer_layers=2)
    x = torch.randn(2, 5, 17, 32)
    # The mixer's output projection starts at zero: same function before training.
    mixed.load_state_dict(plain.state_dict(), strict=False)
    assert torch.allclose(mixed(x), plain(x), atol=1e-6)
    with torch.no_grad():
        mixed.mixer_out.weight.normal_()
    assert not torch.allclose(mixed(x), plain(x), atol=1e-3)
    back = load_adapter(save_adapter(mixed, tmp_path / "a"))
    assert back.config.mixer_layers == 2
    assert torch.allclose(back(x), mixed(x), atol=1e-6)
