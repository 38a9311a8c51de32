"""Every setting of both nodes is reachable from a flag and from its environment variable.

Walks the dataclass fields of ``CloudSettings`` and ``EdgeSettings``: each one (bar the
commented exclusions) has a case below naming its flag and a value other than the
default; the value given as the flag, and as ``<PREFIX><FLAG>`` in the environment
(``--session-ttl-s`` -> ``EVENTSPEC_CLOUD_SESSION_TTL_S``), must reach the field through
the real parser and ``settings_from_args``, and the flag's help must name the variable
(which is how ``tools/flag_docs.py`` puts it in docs/reference/flags.md). A field added
without a flag fails here. Bad values end the command with one line naming the flag or
the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventspec.cloud import cli as cloud_cli
from eventspec.cloud.config import CloudSettings
from eventspec.edge import cli as edge_cli
from eventspec.edge.config import EdgeSettings
from eventspec.shared.node.node_cli import EXIT_USAGE, env_name

#: Fields that are not one scalar setting, with the flags that set them instead.
EXCLUDED = {
    # Nested security objects: the --tls-*, --token-file, --allow-principal,
    # --insecure and --no-reflection flags (and --cloud-tls-* on the edge), each with
    # its own variable (eventspec.shared.wire.flags, tests/integration/test_security.py).
    CloudSettings: {"security"},
    EdgeSettings: {"security", "cloud_security"},
}

#: ServerLimits fields the cloud's flags set (``limits`` is nested: its other fields are
#: protocol caps, or values the server fills in and reports, e.g. kv_slots;
#: max_verify_tokens is advertised from CloudSettings.max_verify_tokens).
LIMITS = {"max_sessions", "max_new_tokens"}

Case = tuple[str, str, object]  # flag, value as typed, the field's value then

CLOUD: dict[str, Case] = {
    "model": ("--model", "/models/video-llava", "/models/video-llava"),
    "host": ("--host", "0.0.0.0", "0.0.0.0"),
    "port": ("--port", "50071", 50071),
    "health_port": ("--health-port", "50072", 50072),
    "device": ("--device", "cuda:1", "cuda:1"),
    "dtype": ("--dtype", "bf16", "bf16"),
    "limits.max_sessions": ("--max-sessions", "12", 12),
    "limits.max_new_tokens": ("--max-new-tokens", "128", 128),
    "kv_cache_gb": ("--kv-cache-gb", "1.5", 1.5),
    "kv_memory_fraction": ("--kv-memory-fraction", "0.5", 0.5),
    "max_seq_len": ("--max-seq-len", "2048", 2048),
    "kv_layout": ("--kv-layout", "slots", "slots"),
    "engine": ("--engine", "hf", "hf"),
    "max_verify_tokens": ("--max-verify-tokens", "9", 9),
    "verify_width": ("--verify-width", "all", "all"),
    "sit_out": ("--sit-out", "auto", "auto"),
    "prefill_chunk": ("--prefill-chunk", "256", "256"),
    "prefill_dtype": ("--prefill-dtype", "fp8", "fp8"),
    "mixed_steps": ("--mixed-steps", "off", False),
    "towers_ahead": ("--towers-ahead", "off", False),
    "prefix_cache_gb": ("--prefix-cache-gb", "4", 4.0),
    "batch_invariant": ("--batch-invariant", "1", True),
    "gil_switch_interval_ms": ("--gil-switch-interval-ms", "0.5", 0.5),
    "gc_freeze": ("--gc-freeze", "off", False),
    "kv_queue": ("--kv-queue", "0", 0),
    "kv_wait_s": ("--kv-wait-s", "2.5", 2.5),
    "session_ttl_s": ("--session-ttl-s", "120", 120.0),
    "first_message_timeout_s": ("--first-message-timeout-s", "2.5", 2.5),
    "features_base_timeout_s": ("--features-base-timeout-s", "1.5", 1.5),
    "input_timeout_s": ("--input-timeout-s", "30", 30.0),
    "max_sessions_per_principal": ("--max-sessions-per-principal", "3", 3),
    "profile_path": ("--profile", "/var/lib/p.msgpack", Path("/var/lib/p.msgpack")),
    "recalibrate": ("--recalibrate", "1", True),
    "emulate_prefill_ms": ("--emulate-prefill-ms", "200", 200.0),
    "emulate_step_ms": ("--emulate-step-ms", "30", 30.0),
    "grace_s": ("--grace-s", "0.5", 0.5),
    "drain_timeout_s": ("--drain-timeout-s", "1", 1.0),
    "seed": ("--seed", "7", 7),
    "metrics_port": ("--metrics-port", "9100", 9100),
    "metrics_host": ("--metrics-host", "0.0.0.0", "0.0.0.0"),
    "metrics_principals": ("--metrics-principals", "hash", "hash"),
}

EDGE: dict[str, Case] = {
    "cloud": ("--cloud", "10.0.0.2:50061", "10.0.0.2:50061"),
    "source": ("--source", "synthetic:3", "synthetic:3"),
    "allow_pickle": ("--allow-pickle", "1", True),
    "sensor_size": ("--sensor-size", "640x480", (640, 480)),
    "max_source_events": ("--max-source-events", "1000000", 1_000_000),
    "max_source_bytes": ("--max-source-bytes", "268435456", 256 << 20),
    "model": ("--model", "tiny-random", "tiny-random"),
    "adapter": ("--adapter", "/models/adapter", Path("/models/adapter")),
    "host": ("--host", "0.0.0.0", "0.0.0.0"),
    "port": ("--port", "50072", 50072),
    "health_port": ("--health-port", "50073", 50073),
    "device": ("--device", "cuda", "cuda"),
    "dtype": ("--dtype", "float16", "float16"),
    "default_jpeg_quality": ("--jpeg-quality", "75", 75),
    "request_timeout_s": ("--request-timeout", "30", 30.0),
    "rpc_timeout_s": ("--rpc-timeout-s", "2", 2.0),
    "cloud_wait_s": ("--cloud-wait-s", "0", 0.0),
    "cloud_first_reply_s": ("--cloud-first-reply-s", "9", 9.0),
    "cloud_rest_s": ("--cloud-rest-s", "2", 2.0),
    "max_queued_asks": ("--max-queued-asks", "16", 16),
    "acceptance_prior": ("--acceptance-prior", "0.8", 0.8),
    "preview_every": ("--preview-every", "2", 2),
    "tree_nodes": ("--tree-nodes", "0", 0),
    "tree_top_k": ("--tree-top-k", "8", 8),
    "tree_per_forward": ("--tree-per-forward", "32", 32),
    "tree_branch_top_k": ("--tree-branch-top-k", "3", 3),
    "drafts_every": ("--drafts-every", "3", 3),
    "speculation": ("--speculation", "always", "always"),
    "draft_engine": ("--draft-engine", "static", "static"),
    "draft_quant": ("--draft-quant", "int8", "int8"),
    "draft_slots": ("--draft-slots", "4", 4),
    "oracle_answers": ("--oracle-answers", "/tmp/answers.json", Path("/tmp/answers.json")),
    "oracle_alpha": ("--oracle-alpha", "0.5", 0.5),
    "oracle_ms_per_token": ("--oracle-ms-per-token", "3.39", 3.39),
    "oracle_prefill_ms": ("--oracle-prefill-ms", "45.4", 45.4),
    "oracle_seed": ("--oracle-seed", "9", 9),
    "oracle_coverage": ("--oracle-coverage", "0.5", 0.5),
    "draft_head": ("--draft-head", "/tmp/head", Path("/tmp/head")),
    "commit_log": ("--commit-log", "/tmp/commits", Path("/tmp/commits")),
    "commit_log_max_mb": ("--commit-log-max-mb", "64", 64),
    "profile_path": ("--profile", "/var/lib/e.msgpack", Path("/var/lib/e.msgpack")),
    "recalibrate": ("--recalibrate", "1", True),
    "vision_backend": ("--vision-backend", "onnx", "onnx"),
    "onnx_dir": ("--onnx-dir", "/models/eventgpt-onnx", Path("/models/eventgpt-onnx")),
    "vision_ort_provider": ("--vision-ort-provider", "tensorrt", "tensorrt"),
    "vision_ort_cuda_graphs": ("--vision-ort-cuda-graphs", "off", False),
    "grace_s": ("--grace-s", "10", 10.0),
    "seed": ("--seed", "3", 3),
    "max_message_bytes": ("--max-message-bytes", "16777216", 16 << 20),
    "metrics_port": ("--metrics-port", "9101", 9101),
    "metrics_host": ("--metrics-host", "0.0.0.0", "0.0.0.0"),
}

NODES: dict[str, tuple[type, Any, dict[str, Case], str]] = {
    "cloud": (CloudSettings, cloud_cli, CLOUD, "EVENTSPEC_CLOUD_"),
    "edge": (EdgeSettings, edge_cli, EDGE, "EVENTSPEC_EDGE_"),
}
CASES = [(node, name) for node, (_, _, cases, _) in NODES.items() for name in cases]


@pytest.fixture(autouse=True)
def _no_eventspec_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)


def _field(settings: object, name: str) -> object:
    for part in name.split("."):
        settings = getattr(settings, part)
    return settings


def _settings(cli: Any, argv: list[str]) -> object:
    settings_from_args: Callable[[Any], object] = cli.settings_from_args
    return settings_from_args(cli.build_parser().parse_args(["serve", *argv]))


def _action(cli: Any, flag: str) -> argparse.Action:
    parser: argparse.ArgumentParser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]._option_string_actions[flag]


@pytest.mark.parametrize("node", sorted(NODES))
def test_every_field_has_a_case_or_a_reason(node: str) -> None:
    cls, _, cases, _ = NODES[node]
    names = {f.name for f in dataclasses.fields(cls)} - EXCLUDED[cls]
    expected = (names - {"limits"}) | ({f"limits.{n}" for n in LIMITS} if "limits" in names
                                       else set())
    assert set(cases) == expected


@pytest.mark.parametrize(("node", "name"), CASES)
def test_the_flag_reaches_the_field(node: str, name: str) -> None:
    cls, cli, cases, _ = NODES[node]
    flag, text, value = cases[name]
    assert _field(cls(), name) != value, "pick a value other than the default"
    argv = [flag] if _action(cli, flag).nargs == 0 else [flag, text]  # a switch takes none
    assert _field(_settings(cli, argv), name) == value


@pytest.mark.parametrize(("node", "name"), CASES)
def test_the_variable_reaches_the_field_and_the_help_names_it(
    node: str, name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, cli, cases, prefix = NODES[node]
    flag, text, value = cases[name]
    variable = env_name(prefix, flag)
    action = _action(cli, flag)
    assert f"${variable}" in (action.help or ""), action.help
    monkeypatch.setenv(variable, text)
    assert _field(_settings(cli, []), name) == value


@pytest.mark.parametrize(("node", "argv", "env", "needle"), [
    ("cloud", ["--kv-memory-fraction", "0"], {}, "--kv-memory-fraction must be in (0, 1]"),
    ("cloud", [], {"EVENTSPEC_CLOUD_KV_MEMORY_FRACTION": "1.5"},
     "$EVENTSPEC_CLOUD_KV_MEMORY_FRACTION (--kv-memory-fraction) must be in (0, 1]"),
    ("cloud", [], {"EVENTSPEC_CLOUD_SESSION_TTL_S": "soon"},
     "$EVENTSPEC_CLOUD_SESSION_TTL_S='soon' is not a number"),
    ("cloud", ["--session-ttl-s", "0"], {}, "--session-ttl-s must be > 0 seconds"),
    ("cloud", ["--first-message-timeout-s", "inf"], {}, "--first-message-timeout-s must be > 0"),
    ("cloud", ["--drain-timeout-s", "-1"], {}, "--drain-timeout-s must be >= 0 seconds"),
    ("cloud", ["--max-verify-tokens", "0"], {}, "--max-verify-tokens must be in 1..129"),
    ("cloud", ["--prefill-chunk", "lots"], {},
     "--prefill-chunk must be off, auto, slack[:R[:PACE]] or a number"),
    ("cloud", ["--prefill-chunk", "slack:1"], {},
     "--prefill-chunk slack:R needs a step-time ratio R > 1"),
    ("cloud", ["--prefill-chunk", "slack:2:-1"], {},
     "--prefill-chunk slack:R:PACE needs a pace of PACE >= 0 ms"),
    ("cloud", ["--prefix-cache-gb", "-1"], {}, "--prefix-cache-gb must be >= 0"),
    ("cloud", [], {"EVENTSPEC_CLOUD_PREFILL_CHUNK": "0"},
     "$EVENTSPEC_CLOUD_PREFILL_CHUNK (--prefill-chunk) must be >= 1 token"),
    ("cloud", [], {"EVENTSPEC_CLOUD_ENGINE": "gpu"},
     "$EVENTSPEC_CLOUD_ENGINE (--engine) must be one of auto, static, hf"),
    ("cloud", [], {"EVENTSPEC_CLOUD_DTYPE": "int8"}, "$EVENTSPEC_CLOUD_DTYPE (--dtype)"),
    ("cloud", [], {"EVENTSPEC_CLOUD_RECALIBRATE": "sometimes"},
     "$EVENTSPEC_CLOUD_RECALIBRATE='sometimes' is not a switch (1 or 0)"),
    ("cloud", [], {"EVENTSPEC_CLOUD_MAX_SESSIONS": "-1"},
     "$EVENTSPEC_CLOUD_MAX_SESSIONS (--max-sessions) must be >= 0 (0: auto)"),
    ("cloud", ["--seed", "-1"], {}, "--seed must be in 0.."),
    ("cloud", [], {"EVENTSPEC_CLOUD_METRICS_PRINCIPALS": "sha1"},
     "$EVENTSPEC_CLOUD_METRICS_PRINCIPALS (--metrics-principals) must be one of name, hash, "
     "none"),
    ("edge", ["--acceptance-prior", "1.5"], {}, "--acceptance-prior must be in [0, 1]"),
    ("edge", ["--preview-every", "0"], {}, "--preview-every must be >= 1"),
    ("edge", ["--draft-engine", "oracle"], {}, "--draft-engine oracle needs --oracle-answers"),
    ("edge", ["--oracle-alpha", "1.2"], {}, "--oracle-alpha must be in [0, 1]"),
    ("edge", ["--draft-head", "/tmp/h", "--draft-engine", "static"], {},
     "--draft-head needs the HF drafter"),
    ("edge", ["--commit-log-max-mb", "0"], {}, "--commit-log-max-mb"),
    ("edge", [], {"EVENTSPEC_EDGE_ORACLE_MS_PER_TOKEN": "-1"},
     "$EVENTSPEC_EDGE_ORACLE_MS_PER_TOKEN (--oracle-ms-per-token) must be >= 0 ms"),
    ("edge", ["--rpc-timeout-s", "0"], {}, "--rpc-timeout-s must be > 0 seconds"),
    ("edge", ["--max-message-bytes", "1000"], {}, "--max-message-bytes must be in 1048576.."),
    ("edge", [], {"EVENTSPEC_EDGE_SPECULATION": "never"},
     "$EVENTSPEC_EDGE_SPECULATION (--speculation) must be one of auto, always"),
    ("edge", [], {"EVENTSPEC_EDGE_VISION_BACKEND": "tensorrt"},
     "$EVENTSPEC_EDGE_VISION_BACKEND (--vision-backend) must be one of torch, onnx"),
    ("edge", [], {"EVENTSPEC_EDGE_VISION_ORT_PROVIDER": "gpu"},
     "$EVENTSPEC_EDGE_VISION_ORT_PROVIDER (--vision-ort-provider) must be one of auto, cuda, "
     "tensorrt"),
    ("edge", [], {"EVENTSPEC_EDGE_SENSOR_SIZE": "640"}, "$EVENTSPEC_EDGE_SENSOR_SIZE='640'"),
    ("edge", ["--max-source-events", "0"], {}, "--max-source-events must be >= 1, got 0"),
    ("edge", [], {"EVENTSPEC_EDGE_MAX_SOURCE_BYTES": "-1"},
     "$EVENTSPEC_EDGE_MAX_SOURCE_BYTES (--max-source-bytes) must be >= 1"),
    ("edge", [], {"EVENTSPEC_EDGE_HEALTH_PORT": "probe"},
     "$EVENTSPEC_EDGE_HEALTH_PORT='probe' is not an integer"),
    ("edge", [], {"EVENTSPEC_EDGE_CLOUD_WAIT_S": "-1"},
     "$EVENTSPEC_EDGE_CLOUD_WAIT_S (--cloud-wait-s) must be >= 0 seconds"),
])
def test_a_bad_value_is_one_line_naming_the_flag_or_variable(
    node: str, argv: list[str], env: dict[str, str], needle: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    _, cli, _, _ = NODES[node]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        _settings(cli, argv)
    assert exited.value.code == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"eventspec-{node}: error: "), lines
    assert needle in lines[0], lines[0]


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTSPEC_CLOUD_SESSION_TTL_S", "30")
    settings = _settings(cloud_cli, ["--session-ttl-s", "90"])
    assert isinstance(settings, CloudSettings) and settings.session_ttl_s == 90.0
