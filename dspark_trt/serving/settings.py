"""The serve settings, listed once: each field carries its default, its help text and its CLI flag.

    DecodeSettings        how the served model decodes (runtime, device, top-k, batch, queue, …): config.pbtxt
                          parameters, flags of ``dspark serve`` and ``dspark triton-repo``
    ├─ ModelSettings      + the export or checkpoint pair it serves: all of config.pbtxt's parameters, written
    │                     by ``repository.write_model_repository``, parsed back by the Triton model
    └─ RepositorySettings + the instance group (instances, GPUs): what ``write_model_repository`` is told
       └─ ServeOptions    + the export of a checkpoint, the servers' endpoints and the front end: ``dspark serve``

A field's ``Setting`` (``dataclasses.field`` metadata) says how it is written on a command line (``cli/``
generates the argparse options from it) and how its text parses back (the same ``parse`` reads a flag's
value and a config.pbtxt string parameter). ``None`` means the library's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from ..errors import DSparkTrtError
from ..runtime.draft_options import verify_length
from ..topk import DEFAULT_TOPK, parse_topk, topk_text

__all__ = ["Setting", "SettingError", "setting_of", "DecodeSettings", "ModelSettings", "RepositorySettings",
           "ServeOptions", "RUNTIMES", "topk_value", "gpu_list"]

RUNTIMES = ("tensorrt", "onnxruntime", "torch")
DTYPES = ("fp32", "fp16", "bf16")
_SETTING = "dspark_setting"


class SettingError(ValueError):
    """A value's text is malformed; the message says how to write it (argparse shows it as is)."""


@dataclass(frozen=True)
class Setting:
    """How one setting is written: ``flag`` on a command line (None: none), ``parse`` from text (None: the text
    itself), ``off``: a second flag, with its help, that sets the value to None (``--no-openai``). A bool field's
    flag is a switch: ``--access-log`` sets True, ``--no-restart`` sets False."""

    help: str
    flag: str | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    group: str = "model"  # model | endpoints | security | server (``dspark serve``'s help groups; "export" joins
    # "model")
    off: tuple[str, str] | None = None
    many: bool = False  # the flag may be given several times: the value is a tuple of them


def setting(default, help: str, *, repr: bool = True, **how) -> Any:
    """A dataclass field with this default and its ``Setting`` (``repr=False``: a secret, never in the repr)."""
    return field(default=default, repr=repr, metadata={_SETTING: Setting(help, **how)})


def setting_of(f: dataclasses.Field) -> Setting | None:
    return f.metadata.get(_SETTING)


def topk_value(text: str) -> int | None:
    """``--topk`` values and the ``topk`` parameter: K >= 1, or 'off' (dense; 0 too, as served models have always
    read it): ``topk.parse_topk``, its refusal as a ``SettingError``. ``DEFAULT_TOPK`` (a ``str``, which argparse
    passes through this function as a flag's default) stays itself."""
    if text is DEFAULT_TOPK:
        return DEFAULT_TOPK
    try:
        return parse_topk(text, zero_is_off=True)
    except DSparkTrtError as e:
        raise SettingError(str(e)) from None



def gpu_list(text: str) -> list[int]:
    """``--gpus`` values: device ids >= 0 separated by commas."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SettingError(f"--gpus takes device ids separated by commas (e.g. 0,1), got {text!r}") from None
    if not ids or min(ids) < 0:
        raise SettingError(f"--gpus takes device ids >= 0 separated by commas, got {text!r}")
    return ids


@dataclass(frozen=True)
class DecodeSettings:
    """How the served model decodes (config.pbtxt parameters; flags of ``dspark serve`` and ``triton-repo``)."""

    runtime: str | None = setting(
        None, "force the runtime (default: tensorrt where TensorRT is importable and the export has engines, else "
        "onnxruntime; torch for a checkpoint pair)", flag="--runtime", choices=RUNTIMES)
    device: str | None = setting(None, "cpu or cuda (default: cuda for tensorrt, else cpu)", flag="--device")
    topk: int | None = setting(
        DEFAULT_TOPK, "draft top-k: K candidates per draft slot, or 'off' (dense) (default: the drafter's)", flag="--topk",
        parse=topk_value, metavar="K|off")
    confidence_threshold: float | None = setting(
        None, "verify only drafts whose confidence is at least this", flag="--confidence-threshold", parse=float)
    verify_drafts: int | str | None = setting(
        None, "verify at most L drafts per round (default: all N; fewer is faster on a CPU; 'auto' chooses each "
        "round from the measured verify cost and acceptance)", flag="--verify-drafts", parse=verify_length,
        metavar="L|auto")
    max_batch_size: int = setting(64, "requests decoded together (in-flight batching; default 64)",
                                  flag="--max-batch-size", parse=int)
    max_context: int | None = setting(None, "refuse prompt + max_tokens beyond this (default: the target's context)",
                                      flag="--max-context", parse=int)
    max_queue: int | None = setting(
        None, "requests allowed to wait for a batch row (per instance); more are refused with 'server busy' "
        "(HTTP 503; default: no bound)", flag="--max-queue", parse=int, metavar="N")
    threads: int = setting(0, "CPU threads of each model instance (torch / onnxruntime intra-op; default: library "
                           "default)", flag="--threads", parse=int)


@dataclass(frozen=True)
class ModelSettings(DecodeSettings):
    """The served model's parameters: config.pbtxt ``parameters`` (all strings there), read back by the model."""

    export_dir: str = setting("", "the export directory served (absolute, or relative to the version directory)")
    drafter_dir: str = setting("", "the drafter checkpoint of a served pair (absolute or relative, as export_dir)")
    target_dir: str = setting("", "the target checkpoint of a served pair (absolute or relative, as export_dir)")

    def __post_init__(self):
        if self.device is None:  # the runtime's device: cuda for tensorrt, else cpu
            object.__setattr__(self, "device", "cuda" if self.runtime == "tensorrt" else "cpu")

    def to_parameters(self) -> dict[str, str]:
        """config.pbtxt's parameters: unset ones left out; the top-k as ``topk_text`` writes it (the drafter's own
        top-k left out)."""
        out = {k: str(v) for k, v in asdict(self).items() if v is not None and v != "" and k != "topk"}
        return out if self.topk is DEFAULT_TOPK else {**out, "topk": topk_text(self.topk)}

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> "ModelSettings":
        out = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            raw, parse = str(params[f.name]).strip(), setting_of(f).parse
            if parse is None:  # paths, runtime, device: the text
                out[f.name] = raw
            elif raw == "":
                out[f.name] = f.default
            else:
                try:
                    out[f.name] = parse(raw)
                except ValueError as e:
                    why = str(e) if isinstance(e, SettingError) else "is not a number"
                    raise DSparkTrtError(f"model parameter {f.name}={raw!r}: {why}; fix config.pbtxt") from None
        return cls(**out)

    def resolved(self, base: str | Path) -> "ModelSettings":
        """These settings with relative model paths taken relative to ``base`` (the model's version directory,
        where ``dspark triton-repo --copy`` puts the export or the checkpoint pair)."""
        at = lambda p: str(Path(base) / p) if p and not Path(p).is_absolute() else p  # noqa: E731
        return dataclasses.replace(self, export_dir=at(self.export_dir), drafter_dir=at(self.drafter_dir),
                                   target_dir=at(self.target_dir))

    def check(self) -> "ModelSettings":
        if bool(self.export_dir) == bool(self.drafter_dir or self.target_dir):
            raise DSparkTrtError("give either export_dir or drafter_dir + target_dir (a checkpoint pair)")
        if not self.export_dir and not (self.drafter_dir and self.target_dir):
            raise DSparkTrtError("a checkpoint pair needs both drafter_dir and target_dir")
        if self.runtime not in RUNTIMES:
            raise DSparkTrtError(f"unknown runtime {self.runtime!r}: choose one of {', '.join(RUNTIMES)}")
        if self.export_dir and self.runtime == "torch":
            raise DSparkTrtError("runtime torch runs a checkpoint pair (--drafter/--target), not an export directory; "
                                 "use onnxruntime or tensorrt for an export")
        if not self.export_dir and self.runtime == "tensorrt":
            raise DSparkTrtError("runtime tensorrt runs an export directory's engines; export first (dspark-export)")
        if self.max_batch_size < 1:
            raise DSparkTrtError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue is not None and self.max_queue < 0:
            raise DSparkTrtError(f"max_queue must be >= 0 (requests allowed to wait), got {self.max_queue}; leave "
                                 f"it unset for no bound")
        for path in (self.export_dir, self.drafter_dir, self.target_dir):
            if path and not Path(path).is_dir():
                raise DSparkTrtError(f"model directory {path} does not exist; pass an existing directory")
        return self


@dataclass(frozen=True)
class RepositorySettings(DecodeSettings):
    """What ``write_model_repository`` is told besides the source: the decoding and the instance group."""

    instances: int = setting(1, "model instances, each with its own decoder and in-flight batch (default 1)",
                             flag="--instances", parse=int, metavar="N")
    gpus: list[int] | None = setting(None, "GPU ids the instances run on, e.g. 0,1 (GPU runtimes; N instances on "
                                     "each)", flag="--gpus", parse=gpu_list, metavar="IDS")

    def decode_settings(self) -> dict:
        """The ``DecodeSettings`` fields of these settings, by name."""
        return {f.name: getattr(self, f.name) for f in fields(DecodeSettings)}


@dataclass(frozen=True)
class ServeOptions(RepositorySettings):
    """Everything ``dspark serve`` can be told (None: the library default)."""

    # the export of a checkpoint source (topk and max_context above apply to it too)
    dtype: str | None = setting(None, "export dtype of a checkpoint (default: bf16 with TensorRT, fp32 on a CPU "
                                "host)", flag="--dtype", choices=DTYPES, group="export")
    cache_dir: str | Path | None = setting(
        None, "where checkpoint exports are cached (default: the serve/ directory of the cache root, "
        "~/.cache/dspark-trt/serve unless DSPARK_TRT_CACHE or XDG_CACHE_HOME moves it)", flag="--cache-dir",
        metavar="DIR", group="export")
    # endpoints
    openai_port: int | None = setting(
        9000, "OpenAI-compatible API port (default 9000; 0 = any free port)", flag="--openai-port", parse=int,
        group="endpoints", off=("--no-openai", "no OpenAI front end: Triton's endpoints only"))
    http_port: int = setting(8000, "Triton HTTP port (default 8000; 0 = any free port)", flag="--http-port",
                             parse=int, group="endpoints")
    grpc_port: int = setting(8001, "Triton gRPC port (default 8001; 0 = any free port)", flag="--grpc-port",
                             parse=int, group="endpoints")
    metrics_port: int = setting(8002, "Triton metrics port (default 8002; 0 = any free port)", flag="--metrics-port",
                                parse=int, group="endpoints")
    host: str = setting("127.0.0.1", "address the OpenAI API binds (default 127.0.0.1; 0.0.0.0 for all; Triton's "
                        "endpoints stay on loopback unless --triton-host says otherwise)", flag="--host",
                        group="endpoints")
    triton_host: str | None = setting(
        None, "address Triton's HTTP and gRPC endpoints bind (default: loopback, 127.0.0.1, or ::1 for an IPv6 "
        "--host, whatever --host says); published, their model-control APIs answer only dspark serve",
        flag="--triton-host", metavar="ADDR", group="endpoints")
    metrics_host: str | None = setting(
        None, "address Triton's metrics endpoint binds (default: --triton-host's; e.g. 0.0.0.0 to publish the "
        "metrics alone, for Prometheus)", flag="--metrics-host", metavar="ADDR", group="endpoints")
    served_model_name: str | None = setting(
        None, "the model name clients send to the OpenAI API (default: the Triton model's, dspark)",
        flag="--served-model-name", metavar="NAME", group="endpoints")
    model: str | None = setting(None, "with a REPO: the model the OpenAI API serves (default: dspark, or its only "
                                "model)", flag="--model", metavar="NAME", group="endpoints")
    chat_template: str | None = setting(  # the template's text (the flag names its file)
        None, "a Jinja chat template for /v1/chat/completions (default: the tokenizer's own)", flag="--chat-template",
        metavar="FILE", group="endpoints")
    access_log: bool = setting(False, "log every OpenAI API request", flag="--access-log", group="endpoints")
    # security (the keys: never in a repr, a log or an error)
    api_keys: tuple[str, ...] = setting(
        (), "a key the OpenAI API requires on /v1/* as 'Authorization: Bearer KEY' (repeat for several; a key "
        "given here shows in ps: prefer --api-key-file or DSPARK_API_KEY)", flag="--api-key", metavar="KEY",
        many=True, group="security", repr=False)
    api_key_file: str | None = setting(
        None, "read the API keys from FILE, one a line (kept out of ps; DSPARK_API_KEY, several separated by "
        "commas, adds keys too)", flag="--api-key-file", metavar="FILE", group="security")
    ssl_keyfile: str | None = setting(None, "serve the OpenAI API over HTTPS with this private key (PEM; with "
                                      "--ssl-certfile)", flag="--ssl-keyfile", metavar="FILE", group="security")
    ssl_certfile: str | None = setting(None, "the HTTPS certificate (chain) of --ssl-keyfile (PEM)",
                                       flag="--ssl-certfile", metavar="FILE", group="security")
    # servers
    restart: bool = setting(True, "exit 1 when the model's process or tritonserver dies instead of restarting it",
                            flag="--no-restart", group="server")
    tritonserver: str | None = setting(None, "this tritonserver binary", flag="--tritonserver", metavar="PATH",
                                       group="server")
    log_file: str | Path | None = setting(None, "tritonserver's log (default: this terminal)", flag="--log-file",
                                          metavar="FILE", group="server")
    drain_timeout: float = setting(
        30.0, "SIGTERM: seconds in-flight requests and streams get to finish while new ones are refused (503, "
        "Retry-After) and readiness is false; then everything stops, exit 0 (default 30)", flag="--drain-timeout",
        parse=float, metavar="SECONDS", group="server")
    exit_timeout: int = setting(30, "seconds tritonserver drains requests when stopped (default 30)",
                                flag="--exit-timeout", parse=int, group="server")
    startup_timeout: float = setting(900.0, "seconds to wait for readiness (default 900)", flag="--timeout",
                                     parse=float, group="server")
    reload_timeout: float = setting(120.0, "seconds a model reload may take after its stub died; then the whole "
                                    "server is restarted", group="server")
    # set by the CLI: the flags given that change how a repository is written (refused with a ready-made REPO)
    repository_flags: list[str] = field(default_factory=list)

    def writer_options(self) -> dict:
        """Keyword arguments of ``write_model_repository`` beyond the source: the ``RepositorySettings`` fields."""
        out = {f.name: getattr(self, f.name) for f in fields(RepositorySettings)}
        out["gpus"] = list(self.gpus) if self.gpus else None
        return out
