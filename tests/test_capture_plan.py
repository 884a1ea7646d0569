"""A capture resolved once into a frozen plan, and settings named by field below the command line.

The capture modules receive a ``CapturePlan`` (``kvprof.capture.plan.resolve``), never the
``CaptureConfig``; a child process resolves the plan's settings again to the same plan. A
message from below the command line names a setting by its field (``Setting``): the Python
API reads the field, the command line its flag, as before.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import orjson
import pytest
import torch

from kvprof.capture.config import CaptureConfig
from kvprof.capture.defaults import CPU_DEFAULT_LAYERS, CPU_LAYER_DECODE_SIZES, DEFAULT_DECODE_SIZES
from kvprof.capture.plan import CapturePlan, resolve, resolve_settings
from kvprof.cli import build_parser, main
from kvprof.commands import flag_namer, flag_names
from kvprof.core.errors import KvprofError, Setting, UsageError, Words, decoded, encoded, rendered

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def test_a_plan_holds_every_derived_value_and_is_frozen():
    config = CaptureConfig(model="llama-3.1-8b", tp=2, phases=["decode"], context="layer", device="cpu")
    given = dataclasses.replace(config)
    plan = resolve(config)
    assert config == given  # the caller's configuration stays as it was
    resolved = config.validate().resolved_for("cpu")
    assert plan.device == CPU and plan.layout == "mha" and plan.shape == resolved.rank_shape()
    assert plan.layers == CPU_DEFAULT_LAYERS and plan.threads == 1
    assert [p.size for p in plan.phases] == list(CPU_LAYER_DECODE_SIZES) and not any(p.graph for p in plan.phases)
    assert plan.cache_dtype == plan.input_dtype == torch.bfloat16 and plan.loc_dtype == torch.int64
    assert plan.context_len == resolved.context_len and plan.reference_steps == resolved.reference_steps
    assert set(plan.device_defaults) >= {"layers", "threads", "decode_sizes", "context_len"}
    assert plan.run_id and plan.final == Path("traces") / plan.run_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.writer_options["x"] = {}  # type: ignore[index]


def test_a_plan_resolved_for_cuda_keeps_the_gpu_sizes_and_graphs():
    plan = resolve(CaptureConfig(phases=["decode"], device="cuda"), torch.device("cuda"))
    assert [p.size for p in plan.phases] == list(DEFAULT_DECODE_SIZES) and all(p.graph for p in plan.phases)
    assert plan.layers == plan.shape.layers == 80 and plan.threads is None


def test_a_child_resolves_the_settings_to_the_same_plan():
    """What the nsys child and each rank do with the settings they are handed."""
    plan = resolve(CaptureConfig(model="deepseek-v2-lite", phases=["decode", "prefill"], device="cpu",
                                 writer_options={"mla_cat_copy": {"x": 1}}))
    assert plan.layout == "mla" and "mla_cat_copy" in plan.variants  # the layout's own defaults
    again = resolve_settings(orjson.loads(orjson.dumps(dict(plan.settings))))
    assert again == plan
    # the manifest's record: the resolved configuration, its derived values under "resolved"
    doc = plan.manifest_config()
    assert doc["run_id"] == plan.run_id and doc["resolved"]["layout"] == "mla"
    doc["resolved"]["layout"] = "changed"
    assert plan.settings["resolved"]["layout"] == "mla"  # a copy: the plan stays as it was


def test_capture_modules_take_the_plan_not_the_configuration():
    """No capture module below the resolution reads a CaptureConfig: only plan.py (which
    resolves it), runtime.py (prepare: the configuration-level start) and config.py itself name it."""
    allowed = {"config.py", "plan.py", "runtime.py"}
    for path in sorted((ROOT / "kvprof" / "capture").glob("*.py")):
        if path.name in allowed:
            continue
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert "CaptureConfig" not in names, path.name


# -- settings named by field, flags only on the command line ------------------------------------
def _setting_fields() -> set[str]:
    """Every field a module below the command line names with Setting("...")."""
    out = set()
    for path in (ROOT / "kvprof").rglob("*.py"):
        if "commands" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Setting"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.add(node.args[0].value)
    return out


def test_every_setting_named_below_is_a_flag_of_a_command():
    fields = _setting_fields()
    assert {"layers", "context", "max_memory_gb", "run_id", "force"} <= fields
    parser = build_parser()
    flags = set(flag_names(parser).values())
    name = flag_namer(parser)
    missing = {f: name(f) for f in fields if name(f) not in flags}
    assert not missing, f"settings whose flag no command has: {missing}"
    assert name("decode_sizes") == "--batch-sizes" and name("phases") == "--phase" and name("output") == "--out"


def test_an_error_names_the_field_for_the_api_and_the_flag_on_the_command_line(tmp_path, capsys):
    config = CaptureConfig(model="deepseek-v2-lite", k_scale=1.0, device="cpu", output=str(tmp_path))
    with pytest.raises(UsageError) as err:
        resolve(config)
    assert str(err.value) == "the mla layout takes no k_scale/v_scale (SGLang's MLA cache casts without scaling)"
    rc = main(["capture", "--model", "deepseek-v2-lite", "--k-scale", "1", "--device", "cpu", "--out", str(tmp_path)])
    err_text = capsys.readouterr().err
    assert rc == 2 and err_text == ("kvprof capture: error: the mla layout takes no --k-scale/--v-scale (SGLang's "
                                    "MLA cache casts without scaling)\n")


def test_words_keep_their_settings_through_text_and_across_a_process():
    w = Words("use ", Setting("decode_sizes"), " or ", Words(Setting("phases"), " decode"))
    assert str(w) == "use decode_sizes or phases decode" and isinstance(w, str)
    flag = flag_namer(build_parser("capture"))
    assert rendered(w, flag) == "use --batch-sizes or --phase decode"
    err = UsageError(Setting("layers"), " 3 fits")
    assert rendered(err, flag) == "--layers 3 fits" and str(err) == "layers 3 fits" and err.exit_code == 2
    assert rendered(decoded(encoded(err)), flag) == "--layers 3 fits"  # a rank's error record
    plain = KvprofError("one line")
    assert plain.args == ("one line",) and plain.words is None and rendered(plain, flag) == "one line"
    assert str(KvprofError("a ", "b")) == "a b"


def test_a_rank_failure_record_is_shown_with_the_flags(tmp_path):
    from kvprof.capture.rank_worker import record_failure
    from kvprof.capture.ranks import _failure

    code = record_failure(tmp_path, 1, UsageError(Setting("layers"), " must be between 1 and 2, got 9"))
    failure = _failure(tmp_path, 1, code)
    assert failure.exit_code == 2
    assert rendered(failure, flag_namer(build_parser("capture"))) == (
        "rank 1 failed: --layers must be between 1 and 2, got 9; no run was kept")


def test_the_capture_runs_the_plan_it_is_given_and_records_it(tmp_path):
    from kvprof import api
    from kvprof.capture.run import capture

    plan = resolve(CaptureConfig(variants=["index_put"], phases=["decode"], decode_sizes=[1], steps=1, warmup=0,
                                 device="cpu", output=str(tmp_path), run_id="p"))
    assert isinstance(plan, CapturePlan)
    captured = capture(plan, log=lambda line: None, read_events=api.trace_events)
    assert captured.run_dir == tmp_path / "p" == plan.final
    recorded = dict(captured.manifest.config["resolved"])
    assert recorded.pop("triton_interpret") == "from the environment"  # the runtime's, added to the plan's record
    assert recorded == dict(plan.settings)["resolved"]


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [[], ["--ranks", "1"]])
def test_on_cuda_the_step_template_is_read_through_the_facades_reader(tmp_path, ranks):
    """Capture reads no trace itself: the step template of each (phase, size) comes from the
    reader kvprof.api hands down (one process), or names by module:function (each rank)."""
    from kvprof.core.rundir import RunDir

    rc = main(["capture", "--model", "small=2x2x128", "--tp", "1", "--phase", "decode", "--batch-sizes", "1,8",
               "--steps", "2", "--warmup", "1", "--variants", "two_stream", "--device", "cuda", "--no-progress",
               "--no-summary", "--out", str(tmp_path), "--run-id", "t", *ranks])
    assert rc == 0
    entry = RunDir(tmp_path / "t").read_manifest().variants["two_stream"]
    assert entry.kernels_per_write == {"decode 1": 2, "decode 8": 2}  # K and V: two copies per write


def test_a_failed_first_analysis_names_the_flag(tmp_path, monkeypatch, capsys):
    """The capture's first summary says why there is none with the command line's words."""
    import shutil

    from kvprof import api
    from kvprof.capture import run as capture_run
    from kvprof.capture.plan import CapturedRun
    from kvprof.core.rundir import RunDir

    run = tmp_path / "out" / "r1"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "real", run)
    manifest = RunDir(run).read_manifest()
    monkeypatch.setattr(capture_run, "capture", lambda plan, **_: CapturedRun(run, manifest, []))

    def refuse(*_: object, **__: object) -> None:
        raise UsageError(Setting("max_events"), " is too small")

    monkeypatch.setattr(api, "analyze", refuse)
    rc = main(["capture", "--out", str(tmp_path / "out"), "--run-id", "r1", "--device", "cpu", "--variants",
               "index_put"])
    out = " ".join(capsys.readouterr().out.split())
    # exit 1: the fixture's nsys export keeps a host name, which the scrub check reports as a kept problem
    assert rc in (0, 1) and "analysis of the capture failed: --max-events is too small" in out


def test_the_nsys_childs_one_line_error_spells_settings_as_its_parent(tmp_path, capsys):
    from kvprof.capture.child import main as child_main

    plan = resolve(CaptureConfig(phases=["decode"], decode_sizes=[1], device="cpu"))
    settings = {**plan.manifest_config(), "layers": 999}
    names = flag_namer(build_parser("capture"))
    spec = tmp_path / "spec.json"
    spec.write_bytes(orjson.dumps({"config": settings, "variant": "index_put",
                                   "names": {k: names(k) for k in settings if k != "resolved"}}))
    assert child_main([str(spec), str(tmp_path / "result.json")]) == 2
    assert capsys.readouterr().err.startswith("kvprof child: --layers must be between 1 and 80")
    spec.write_bytes(orjson.dumps({"config": settings, "variant": "index_put"}))  # a hand-made spec: the field
    assert child_main([str(spec), str(tmp_path / "result.json")]) == 2
    assert capsys.readouterr().err.startswith("kvprof child: layers must be between 1 and 80")
