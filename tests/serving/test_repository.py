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


def test_export_repository_on_a_gpu_runtime_is_a_gpu_instance(tmp_path):
    from tritonclient.grpc import model_config_pb2 as pb

    from dspark_trt.serving.repository import read_model_config, write_model_repository

    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text('{"engines": {}}')
    repo = write_model_repository(tmp_path / "repo", export_dir=export, runtime="tensorrt",
                                  confidence_threshold=0.5, verify_drafts=2)
    config = read_model_config(repo / "dspark" / "config.pbtxt")
    assert pb.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["export_dir"] == str(export.resolve()) and params["confidence_threshold"] == "0.5"
    assert params["verify_drafts"] == "2"
    assert params["device"] == "cuda"


def test_existing_repository_is_not_overwritten(tmp_path, tiny_pair):
    from dspark_trt.serving.repository import write_model_repository

    out = tmp_path / "repo"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(DSparkTrtError, match="not empty"):
        write_model_repository(out, drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target)
    assert (out / "mine.txt").read_text() == "keep"
    with pytest.raises(DSparkTrtError, match="torch runs a checkpoint pair"):
        write_model_repository(tmp_path / "r2", export_dir=out, runtime="torch")
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
    from dspark_trt.serving.engine import ModelSettings, load_decoder
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
