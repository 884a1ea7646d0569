"""Capture runs the MLA and paged layouts through the same passes as the MHA pool: the
manifest names the layout, the writes are counted by path, and layout misuse is a one-line
refusal before anything is written."""

from __future__ import annotations

import json

import orjson
import pytest

from kvprof.capture.defaults import CPU_DEFAULT_LAYERS
from kvprof.cli import main

SMALL = ["--phase", "decode,prefill", "--batch-sizes", "3", "--prefill-tokens", "20", "--steps", "2", "--warmup", "1",
         "--device", "cpu", "--no-progress"]


def test_mla_capture_writes_manifest_with_layout(tmp_path, capsys) -> None:
    rc = main(["capture", "--model", "deepseek-v2-lite", "--variants", "mla_cat_copy", *SMALL, "--no-summary",
               "--out", str(tmp_path), "--run-id", "m"])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["config"]["resolved"]["layout"] == "mla"
    shape = manifest["config"]["resolved"]["shape"]
    assert shape["head_dim"] == 576 and shape["layers"] == 27
    assert list(manifest["variants"]) == ["mla_cat_copy"]
    assert (tmp_path / "m" / "mla_cat_copy.pt.trace.json.gz").exists()


@pytest.mark.parametrize("model,extra,variant,path,layers", [
    ("deepseek-v2-lite", [], "mla_cat_copy", "cat_copy", 27),
    ("llama-3.1-8b", ["--engine", "vllm", "--cache-dtype", "fp8_e4m3", "--k-scale", "0.5", "--v-scale", "0.5"],
     "paged_unfused", "unfused", 32),
])
def test_child_counts_layout_writes(tmp_path, model, extra, variant, path, layers) -> None:
    from kvprof.capture.child import run_child
    from kvprof.cli import build_parser
    from kvprof.commands.capture import config_from_args

    args = build_parser().parse_args(["capture", "--model", model, *extra, *SMALL])
    config = config_from_args(args)
    config.validate()
    spec = tmp_path / "spec.json"
    spec.write_bytes(orjson.dumps({"config": config.as_dict(), "variant": variant}))
    assert run_child(spec, tmp_path / "result.json") == 0
    result = orjson.loads((tmp_path / "result.json").read_bytes())
    # on a CPU a step writes the first CPU_DEFAULT_LAYERS of the model's layers: x (decode + prefill) x 2 steps
    assert config.rank_shape().layers == layers and result["layers"] == list(range(CPU_DEFAULT_LAYERS))
    assert result["paths"] == {path: CPU_DEFAULT_LAYERS * 2 * 2}
    assert result["bytes_per_token"] > 0


@pytest.mark.parametrize("argv,words", [
    (["--model", "deepseek-v3", "--layout", "paged"], "no paged layout"),
    (["--model", "llama-3.1-8b", "--layout", "mla"], "needs an MLA model"),
    (["--model", "deepseek-v3", "--context", "layer"], "writes only"),
    (["--model", "deepseek-v3", "--k-scale", "0.5"], "no --k-scale"),
    (["--model", "deepseek-v3", "--variants", "triton_fused"], "not a writer of the mla layout"),
    (["--model", "llama-3.1-8b", "--engine", "vllm", "--variants", "mla_triton"], "not a writer of the paged layout"),
])
def test_layout_misuse_is_refused_in_one_line(tmp_path, capsys, argv, words) -> None:
    rc = main(["capture", *argv, *SMALL, "--out", str(tmp_path), "--run-id", "bad"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and words in err and "Traceback" not in err, err
    assert not (tmp_path / "bad").exists()


def test_analyze_carries_the_layout_as_a_column(tmp_path, capsys) -> None:
    """The layout is a column of writes.parquet and of summary.json's groups, like the variant:
    from the trace's own metadata and, for the reference rows, from the manifest."""
    import pyarrow.parquet as pq

    rc = main(["capture", "--model", "llama-3.1-8b", "--engine", "vllm", "--variants", "paged_unfused",
               "--phase", "decode", "--batch-sizes", "3", "--steps", "2", "--warmup", "1", "--device", "cpu",
               "--no-progress", "--out", str(tmp_path), "--run-id", "p"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    by_source = {g["source"]: g["layout"] for g in summary["groups"]}
    assert by_source == {"kineto": "paged", "reference": "paged"}
    writes = pq.read_table(tmp_path / "p" / "writes.parquet").to_pandas()
    assert set(writes["layout"]) == {"paged"}
    meta = orjson.loads(__import__("gzip").decompress((tmp_path / "p" / "paged_unfused.pt.trace.json.gz").read_bytes()))
    assert meta["kvprof"]["layout"] == "paged"
