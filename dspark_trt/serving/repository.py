"""``dspark triton-repo``: a Triton model repository serving a DSpark export (or a checkpoint pair).

    REPO/
      README.md                how to launch it (CPU host, GPU host with engines)
      dspark-repository.json   marks the directory as written by us: ``force`` may replace it (and nothing else)
      dspark/config.pbtxt      Python backend, decoupled, instance kind from the runtime, parameters
      dspark/1/model.py        one import: dspark_trt.serving.triton_model.TritonPythonModel
      dspark/1/export/         with ``copy``: the export (or ``drafter/`` + ``target/``), referenced relatively

``config.pbtxt`` is a ``ModelConfig`` protobuf message (``tritonclient.grpc.model_config_pb2``) printed in
the text format, never a string template; ``read_model_config`` parses one back. The model directory
references the export (or checkpoint) by absolute path, or, with ``copy``, holds a copy of it in its version
directory and references that relatively: a repository that can be moved, mounted into a container or shipped
as one directory. The server's Python environment must import ``dspark_trt`` (``dspark serve`` arranges that).

Before anything is written, an export directory is checked to be servable (``check_servable_export``: a
dspark-export manifest of this format version, its drafter graphs and exported target present, engines for
runtime ``tensorrt``), so a wrong directory fails here in one line and not later inside the server.
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_output_dir, write_marker
from ..errors import DSparkTrtError
from ..optional import pip_install
from .served_decoder import choose_runtime
from .settings import ModelSettings, RepositorySettings
from .protocol import INPUTS, OUTPUTS

__all__ = ["build_model_config", "read_model_config", "write_model_repository", "check_servable_export",
           "MODEL_NAME", "REPOSITORY_MARKER"]

MODEL_NAME = "dspark"
REPOSITORY_MARKER = "dspark-repository.json"  # in REPO/: a repository we wrote (``force`` may replace it)
MODEL_PY = '''"""dspark-trt's decoupled Python-backend model (written by `dspark triton-repo`): the logic is in the library."""

from dspark_trt.serving.triton_model import TritonPythonModel  # noqa: F401
'''


def _pb():
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise DSparkTrtError(f"writing a Triton model repository needs tritonclient ({e.name} missing): "
                             f"{pip_install('serve')}") from None
    return model_config_pb2


def build_model_config(settings: ModelSettings, *, name: str = MODEL_NAME, instances: int = 1,
                       gpus: list[int] | None = None):
    """The ``ModelConfig`` message for the served model: ``instances`` model instances (each its own decoder
    and scheduler), on ``gpus`` (device ids) for a GPU runtime."""
    pb = _pb()
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=0)
    config.model_transaction_policy.decoupled = True
    for key, (dtype, dims, optional) in INPUTS.items():
        config.input.append(pb.ModelInput(name=key, data_type=pb.DataType.Value(dtype), dims=dims, optional=optional))
    for key, (dtype, dims) in OUTPUTS.items():
        config.output.append(pb.ModelOutput(name=key, data_type=pb.DataType.Value(dtype), dims=dims))
    gpu = settings.runtime == "tensorrt" or settings.device.startswith("cuda")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise DSparkTrtError(f"instances must be an integer >= 1, got {instances!r}")
    if gpus is not None:
        if not gpu:
            raise DSparkTrtError(f"gpus {list(gpus)} needs a GPU runtime (runtime tensorrt or device cuda); drop "
                                 f"--gpus on a CPU host")
        if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise DSparkTrtError(f"gpus must be one or more device ids >= 0, got {gpus!r}")
    kind = pb.ModelInstanceGroup.Kind.Value("KIND_GPU" if gpu else "KIND_CPU")
    group = pb.ModelInstanceGroup(count=instances, kind=kind)
    if gpus is not None:
        group.gpus.extend(gpus)  # Triton starts `count` instances on each listed GPU
    config.instance_group.append(group)
    for key, value in settings.to_parameters().items():
        config.parameters[key].string_value = value
    return config


def read_model_config(path: str | Path):
    """Parse a ``config.pbtxt`` back into a ``ModelConfig`` message."""
    from google.protobuf import text_format

    return text_format.Parse(Path(path).read_text(), _pb().ModelConfig())


def write_model_repository(out: str | Path, *, export_dir: str | Path | None = None,
                           drafter_dir: str | Path | None = None, target_dir: str | Path | None = None,
                           model_name: str = MODEL_NAME, copy: bool = False, force: bool = False,
                           **settings) -> Path:
    """Write the repository (atomically: a failed write leaves nothing; an existing one is replaced only with
    ``force``, and only when it is a repository written here or an empty directory).

    ``copy``: copy the export (or the drafter and target) into ``REPO/<model>/1/`` and reference it relative to
    that directory, so that the repository stands alone; otherwise it references them by absolute path.
    ``settings``: ``RepositorySettings`` fields — the model's parameters (runtime, device, topk, …, written to
    config.pbtxt) and its instance group: ``instances`` model instances (each runs its own decoder and
    scheduler) on ``gpus`` (GPU ids; GPU runtimes only). ``max_queue``: requests allowed to wait for a batch
    row per instance (default: no bound); the next one is refused with a "server busy" error (Triton
    ``UNAVAILABLE``).
    """
    import shutil
    from dataclasses import replace

    from google.protobuf import text_format

    resolve = lambda p: str(Path(p).resolve()) if p else ""  # noqa: E731
    wanted = RepositorySettings(**settings)
    if export_dir:
        check_servable_export(export_dir, wanted.runtime)
    decode = wanted.decode_settings()
    decode["runtime"] = choose_runtime(export_dir=resolve(export_dir), forced=wanted.runtime)
    settings = ModelSettings(export_dir=resolve(export_dir), drafter_dir=resolve(drafter_dir),
                             target_dir=resolve(target_dir), **decode).check()
    copies = {}  # name in the version directory → source (ModelSettings.resolved reads the names back)
    if copy:
        copies = {name: src for name in ("export", "drafter", "target") if (src := getattr(settings, f"{name}_dir"))}
        inside = [src for src in copies.values() if Path(out).resolve().is_relative_to(src)]
        if inside:
            raise DSparkTrtError(f"--copy would copy {inside[0]} into itself: write the repository outside it")
        settings = replace(settings, **{f"{name}_dir": name for name in copies})
    config = build_model_config(settings, name=model_name, instances=wanted.instances, gpus=wanted.gpus)
    with atomic_output_dir(out, force=force, marker=REPOSITORY_MARKER) as tmp:
        model = tmp / model_name
        (model / "1").mkdir(parents=True)
        for name, src in copies.items():
            shutil.copytree(src, model / "1" / name)  # symlinks followed: the copy holds the files
        (model / "config.pbtxt").write_text(text_format.MessageToString(config))
        (model / "1" / "model.py").write_text(MODEL_PY)
        (tmp / "README.md").write_text(_readme(settings, model_name))
        write_marker(tmp, "dspark triton-repo", marker=REPOSITORY_MARKER, model=model_name)
    return Path(out)


def check_servable_export(export_dir: str | Path, runtime: str | None = None) -> dict:
    """The manifest of ``export_dir`` when it is a dspark-export directory the model can serve; else one line
    naming what is missing (no manifest or another format version, missing drafter graphs, no exported target,
    no engines for runtime ``tensorrt``)."""
    from ..artifact.export_dir import ExportDir

    export_dir = Path(export_dir)
    if not export_dir.is_dir():
        raise DSparkTrtError(f"export directory {export_dir} does not exist; pass a dspark-export output directory")
    export = ExportDir(export_dir)
    manifest = export.manifest  # format_version checked
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict) or not graphs:
        raise DSparkTrtError(f"{export_dir}/manifest.json lists no drafter graphs: it is not a complete "
                             f"dspark-export output; re-run dspark-export -o {export_dir} --force")
    missing = [g.get("file", name) for name, g in graphs.items()
               if not isinstance(g, dict) or not (export_dir / str(g.get("file", ""))).is_file()]
    if missing:
        raise DSparkTrtError(f"{export_dir} lacks the drafter graph {missing[0]} its manifest lists; re-run "
                             f"dspark-export -o {export_dir} --force")
    export.target  # the exported target graph (and how to add it)
    if runtime == "tensorrt":
        engines = manifest.get("engines") or (manifest.get("target") or {}).get("engines")
        if not engines:
            raise DSparkTrtError(f"runtime tensorrt serves an export's engines and {export_dir} has none; build "
                                 f"them on the GPU host (dspark build-engine) or use runtime onnxruntime")
    return manifest


def _readme(s: ModelSettings, name: str) -> str:
    def where(p: str) -> str:
        return f"`{p}`" if Path(p).is_absolute() else f"`{name}/1/{p}` (a copy, so this directory stands alone)"

    source = f"the export {where(s.export_dir)}" if s.export_dir else (
        f"the checkpoint pair drafter {where(s.drafter_dir)} + target {where(s.target_dir)}")
    return f"""# dspark Triton model repository

Model `{name}`: a decoupled Python-backend model serving {source} with runtime `{s.runtime}` on
`{s.device}` (in-flight batching of up to {s.max_batch_size} requests). Written by `dspark triton-repo`
(`{REPOSITORY_MARKER}` marks it, so `--force` may replace it); `{name}/config.pbtxt` holds the instance group
and the parameters {", ".join(f"`{k}`" for k in s.to_parameters())}; a setting left out takes the
library's default (for an export, the draft settings it was exported with).

## Launch on a CPU host

    {pip_install('serve')}
    dspark serve REPO --http-port 8000 --grpc-port 8001 --metrics-port 8002

`dspark serve` starts the `tritonserver` bundled with PyTriton (`nvidia-pytriton`), which runs the Python
backend on the CPU. Its Python environment is a separate venv (numpy < 2, the same torch, transformers and
onnxruntime as yours) that `dspark serve` builds on first use under `~/.cache/dspark-trt/` (a few minutes,
once). Ctrl-C stops the server.

## Launch on a GPU host with TensorRT engines

Write the repository on that host with `--runtime tensorrt` (the default where TensorRT is importable and
the export has engines); the instance group is then `KIND_GPU`. In NVIDIA's Triton container
(`nvcr.io/nvidia/tritonserver:<yy.mm>-py3`, with dspark-trt installed inside from its clone, `pip install -e
'CLONE[serve]' tensorrt`):

    tritonserver --model-repository REPO

or `dspark serve REPO`, which uses a `tritonserver` found on PATH before the bundled one.

## Requests

HTTP: `curl -d '{{"text_input": "Speculative decoding", "max_tokens": 32}}' localhost:8000/v2/models/{name}/generate`
answers `{{"text_output": ...}}`; `/generate_stream` with `"stream": true` streams each round's tokens (SSE).
gRPC: stream inference (`tritonclient.grpc` `start_stream` / `async_stream_infer`).

Inputs: `text_input` (BYTES [1]) or `input_ids` (INT64 [-1]), `max_tokens` (INT32 [1]), optional
`temperature` (FP32 [1], 0 = greedy), `top_p` (FP32 [1], 1 = off), `top_k` (INT32 [1], 0 = off), `seed`
(INT64 [1]), `stream` (BOOL [1]), `stop` (BYTES [-1]: up to 4 stop strings), `end_id` (INT64 [-1]: stop
token ids, replacing the model's EOS). Outputs: `text_output` (the new text; the prompt is not included),
`output_ids`, and in the final response `finish_reason` (stop / length / cancelled / error),
`prompt_tokens`, `rounds`, `mean_acceptance_length`, `drafted`, `accepted`, `batch_size` (the largest
batch this request was decoded in).
"""
