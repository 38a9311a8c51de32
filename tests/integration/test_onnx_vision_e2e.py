"""An edge served with ``--vision-backend onnx`` answers exactly as one on torch.

Client -> edge -> cloud over real gRPC with the shipped toy pair: the same questions,
in draft_only (the edge's own greedy drafts, so identical drafts show directly), and
speculative with frames and with aligned features (the adapter's ONNX graph feeds the
cloud), on the torch vision path and on ONNX Runtime's CPU execution provider.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.contract.types import FeatureMode, Mode
from tests.support import edge_harness as eh
from tests.support.edge_harness import ask
from tests.support.onnx_vision import toy_onnx_export

QUESTIONS = ["Which way is the object moving?", "What shape is the object?"]
CASES = [(Mode.DRAFT_ONLY, FeatureMode.AUTO), (Mode.SPECULATIVE, FeatureMode.FRAMES),
         (Mode.SPECULATIVE, FeatureMode.ALIGNED)]


async def answers(backend: str, export: Path) -> tuple[list[tuple[int, ...]], str]:
    settings = {"vision_backend": backend, "speculation": "always",
                "onnx_dir": export if backend == "onnx" else None}
    cloud, edge = await eh.start_toy_stack(2, edge_settings=settings)
    address = f"127.0.0.1:{edge.port}"
    try:
        out = []
        for question in QUESTIONS:
            for mode, features in CASES:
                final = await ask(address, question, mode, feature_mode=features, max_new=12)
                assert mode == Mode.DRAFT_ONLY or final.feature_mode == features
                out.append(final.token_ids)
        async with EdgeClient(address, timeout_s=10) as client:
            status = await client.status()
        return out, status.vision_backend
    finally:
        await edge.stop(0)
        await cloud.stop(0)


async def test_onnx_vision_answers_as_torch() -> None:
    export = toy_onnx_export()
    torch_answers, torch_name = await answers("torch", export)
    onnx_answers, onnx_name = await answers("onnx", export)
    assert (torch_name, onnx_name) == ("torch", "onnx (CPUExecutionProvider, fp32)")
    assert all(torch_answers), torch_answers
    assert onnx_answers == torch_answers


async def test_onnx_needs_an_export_dir_and_refuses_a_stale_one(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="--onnx-dir"):
        await EdgeServer(EdgeSettings(port=0, vision_backend="onnx")).start()
    # An export of the toy draft without its adapter: the toy edge loads the adapter.
    from eventspec.edge.model_dirs import TOY_DRAFT_DIR
    from eventspec.edge.vision.onnx_export import export_onnx

    bare = tmp_path / "bare"
    export_onnx(TOY_DRAFT_DIR, None, bare)
    edge = EdgeServer(EdgeSettings(port=0, model="toy", vision_backend="onnx", onnx_dir=bare))
    with pytest.raises(FailedPrecondition, match="holds no adapter") as err:
        await edge.start()
    assert str(bare) in err.value.message and "export-onnx" in err.value.message
