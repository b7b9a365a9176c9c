"""The model repository: config.pbtxt parses back into the ModelConfig it was built from."""

from __future__ import annotations

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.serving.protocol import INPUTS, OUTPUTS

pytestmark = pytest.mark.tritonserver  # needs tritonclient (the serve extra)


def test_checkpoint_pair_repository(tmp_path, tiny_pair):
    from tritonclient.grpc import model_config_pb2 as pb

    from dspark_trt.serving.repository import read_model_config, write_model_repository

    repo = write_model_repository(tmp_path / "repo", drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target,
                                  topk=16, max_batch_size=8)
    config = read_model_config(repo / "dspark" / "config.pbtxt")
    assert config.name == "dspark" and config.backend == "python" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims), i.optional) for i in config.input] == [
        (k, t, d, o) for k, (t, d, o) in INPUTS.items()]
    assert [(o.name, pb.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == [
        (k, t, d) for k, (t, d) in OUTPUTS.items()]
    assert [(g.count, pb.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == [(1, "KIND_CPU")]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["runtime"] == "torch" and params["topk"] == "16" and params["max_batch_size"] == "8"
    assert params["drafter_dir"] == str(tiny_pair.drafter.resolve()) and "export_dir" not in params
    assert "TritonPythonModel" in (repo / "dspark" / "1" / "model.py").read_text()
    assert "dspark serve" in (repo / "README.md").read_text()


def test_export_repository_with_instances_on_gpus(tmp_path, qwen3_topk_export):
    from tritonclient.grpc import model_config_pb2 as pb

    from dspark_trt.serving.repository import read_model_config, write_model_repository

    repo = write_model_repository(tmp_path / "repo", export_dir=qwen3_topk_export, runtime="onnxruntime",
                                  device="cuda", confidence_threshold=0.5, verify_drafts=2, instances=2, gpus=[0, 1],
                                  max_queue=3)
    config = read_model_config(repo / "dspark" / "config.pbtxt")
    (group,) = config.instance_group
    assert (pb.ModelInstanceGroup.Kind.Name(group.kind), group.count, list(group.gpus)) == ("KIND_GPU", 2, [0, 1])
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["export_dir"] == str(qwen3_topk_export.resolve()) and params["confidence_threshold"] == "0.5"
    assert params["verify_drafts"] == "2" and params["max_queue"] == "3"
    assert params["device"] == "cuda" and params["runtime"] == "onnxruntime"


def test_instance_options_are_checked(tmp_path, tiny_pair):
    from dspark_trt.serving.repository import write_model_repository

    pair = dict(drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target)
    with pytest.raises(DSparkTrtError, match="needs a GPU runtime"):
        write_model_repository(tmp_path / "r1", gpus=[0], **pair)
    with pytest.raises(DSparkTrtError, match="instances must be an integer >= 1"):
        write_model_repository(tmp_path / "r2", instances=0, **pair)
    with pytest.raises(DSparkTrtError, match="max_queue must be >= 0"):
        write_model_repository(tmp_path / "r3", max_queue=-1, **pair)
    assert not any(tmp_path.iterdir())


def _broken_copy(export, tmp_path, name, change):
    import json
    import shutil

    out = shutil.copytree(export, tmp_path / name)
    manifest = json.loads((out / "manifest.json").read_text())
    change(out, manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_only_a_servable_export_gets_a_repository(tmp_path, qwen3_topk_export, tiny_pair, capsys):
    """issue 27: any directory with a manifest.json was accepted, and the server died 8 s later."""
    import json

    from dspark_trt.cli.main import main
    from dspark_trt.serving.repository import write_model_repository

    hello = tmp_path / "hello"
    hello.mkdir()
    (hello / "manifest.json").write_text(json.dumps({"hello": 1}))
    first_graph = lambda m: next(iter(m["graphs"].values()))["file"]  # noqa: E731
    cases = [
        (hello, "format_version None"),
        (tiny_pair.drafter, "is a drafter checkpoint, not an export directory"),
        (tiny_pair.drafter.parent, r"is a drafter checkpoint \(drafter/ \+ target/\), not an export directory"),
        (tmp_path / "nowhere", "does not exist"),
        (_broken_copy(qwen3_topk_export, tmp_path, "no-graph", lambda d, m: (d / first_graph(m)).unlink()),
         "lacks the drafter graph"),
        (_broken_copy(qwen3_topk_export, tmp_path, "no-graphs", lambda d, m: m.update(graphs={})), "no drafter graphs"),
        (_broken_copy(qwen3_topk_export, tmp_path, "no-target", lambda d, m: m.pop("target")), "no exported target"),
        (_broken_copy(qwen3_topk_export, tmp_path, "target-gone", lambda d, m: (d / m["target"]["onnx"]).unlink()),
         "is missing"),
    ]
    for i, (export, message) in enumerate(cases):
        with pytest.raises(DSparkTrtError, match=message):
            write_model_repository(tmp_path / f"repo{i}", export_dir=export)
        assert not (tmp_path / f"repo{i}").exists(), message
    with pytest.raises(DSparkTrtError, match="runtime tensorrt serves an export's engines"):
        write_model_repository(tmp_path / "trt", export_dir=qwen3_topk_export, runtime="tensorrt")
    assert main(["triton-repo", str(hello), "-o", str(tmp_path / "cli")]) == 1
    assert "format_version None" in capsys.readouterr().err and not (tmp_path / "cli").exists()


def test_force_replaces_a_repository_we_wrote_and_nothing_else(tmp_path, qwen3_topk_export, tiny_pair):
    """issue 27: a repository had no marker, so --force could never replace it (dspark-export --triton-repo)."""
    from dspark_trt.serving.repository import REPOSITORY_MARKER, read_model_config, write_model_repository

    out = tmp_path / "repo"
    write_model_repository(out, export_dir=qwen3_topk_export)
    assert (out / REPOSITORY_MARKER).is_file()
    with pytest.raises(DSparkTrtError, match="pass --force"):
        write_model_repository(out, export_dir=qwen3_topk_export, max_batch_size=4)
    write_model_repository(out, export_dir=qwen3_topk_export, max_batch_size=4, force=True)
    params = read_model_config(out / "dspark" / "config.pbtxt").parameters
    assert params["max_batch_size"].string_value == "4"
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(DSparkTrtError, match="not empty"):
        write_model_repository(other, export_dir=qwen3_topk_export, force=True)
    assert (other / "notes.txt").read_text() == "keep"
    with pytest.raises(DSparkTrtError, match="not empty"):  # an export is not a repository: --force keeps it
        write_model_repository(qwen3_topk_export, drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target,
                               force=True)
    assert (qwen3_topk_export / "manifest.json").is_file()


def test_readme_names_only_the_parameters_config_pbtxt_holds(tmp_path, qwen3_topk_export):
    """issue 27: the README said config.pbtxt holds the top-k and confidence threshold; it held neither."""
    from dspark_trt.serving.repository import read_model_config, write_model_repository

    repo = write_model_repository(tmp_path / "repo", export_dir=qwen3_topk_export)
    readme = (repo / "README.md").read_text()
    held = set(read_model_config(repo / "dspark" / "config.pbtxt").parameters)
    assert "top-k" not in readme and "confidence threshold" not in readme
    assert all(f"`{name}`" in readme for name in held) and "`topk`" not in readme
    assert "not included" in readme  # text_output carries the new text only
    with_topk = write_model_repository(tmp_path / "repo2", export_dir=qwen3_topk_export, topk=8)
    assert "`topk`" in (with_topk / "README.md").read_text()


def test_existing_repository_is_not_overwritten(tmp_path, tiny_pair, qwen3_topk_export):
    from dspark_trt.serving.repository import write_model_repository

    out = tmp_path / "repo"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(DSparkTrtError, match="not empty"):
        write_model_repository(out, drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target)
    assert (out / "mine.txt").read_text() == "keep"
    with pytest.raises(DSparkTrtError, match="torch runs a checkpoint pair"):
        write_model_repository(tmp_path / "r2", export_dir=qwen3_topk_export, runtime="torch")
    assert not (tmp_path / "r2").exists()


def test_cli_writes_a_repository(tmp_path, tiny_pair, capsys):
    from dspark_trt.cli.main import main

    assert main(["triton-repo", "--drafter", str(tiny_pair.drafter), "--target", str(tiny_pair.target),
                 "-o", str(tmp_path / "repo")]) == 0
    assert "dspark serve" in capsys.readouterr().out
    assert main(["triton-repo", str(tmp_path), "--drafter", str(tiny_pair.drafter), "-o", str(tmp_path / "r")]) == 1
    assert "not both" in capsys.readouterr().err


def test_serve_refuses_a_directory_that_is_not_a_repository(tmp_path, capsys):
    from dspark_trt.cli.main import main

    assert main(["serve", str(tmp_path)]) == 1
    assert "not a Triton model repository" in capsys.readouterr().err


def test_copied_pair_stands_alone_and_loads_where_the_repository_moves(tmp_path, tiny_pair, capsys):
    import shutil

    from dspark_trt.cli.main import main
    from dspark_trt.serving.served_decoder import load_decoder
    from dspark_trt.serving.settings import ModelSettings
    from dspark_trt.serving.repository import read_model_config

    src = tmp_path / "src"
    shutil.copytree(tiny_pair.drafter, src / "drafter")
    shutil.copytree(tiny_pair.target, src / "target")
    assert main(["triton-repo", "--drafter", str(src / "drafter"), "--target", str(src / "target"), "--copy",
                 "-o", str(tmp_path / "repo")]) == 0
    shutil.rmtree(src)  # the repository carries its own copy ...
    moved = tmp_path / "elsewhere" / "repo"
    shutil.move(str(tmp_path / "repo"), str(moved))  # ... and works where it is moved to
    params = {k: v.string_value for k, v in read_model_config(moved / "dspark" / "config.pbtxt").parameters.items()}
    assert (params["drafter_dir"], params["target_dir"]) == ("drafter", "target")
    assert "a copy" in (moved / "README.md").read_text()
    settings = ModelSettings.from_parameters(params).resolved(moved / "dspark" / "1")  # as the Triton model does
    assert settings.drafter_dir == str(moved / "dspark" / "1" / "drafter")
    out = load_decoder(settings).generate([[3, 4, 5]], 6)
    alone = load_decoder(ModelSettings(drafter_dir=str(tiny_pair.drafter), target_dir=str(tiny_pair.target),
                                       runtime="torch")).generate([[3, 4, 5]], 6)
    assert out.tokens == alone.tokens
    assert ModelSettings(export_dir="/abs/x").resolved(moved).export_dir == "/abs/x"  # absolute paths kept

    assert main(["triton-repo", "--drafter", str(tiny_pair.drafter), "--target", str(tiny_pair.target), "--copy",
                 "-o", str(tiny_pair.drafter / "repo")]) == 1
    assert "into itself" in capsys.readouterr().err and not (tiny_pair.drafter / "repo").exists()
