"""Print the versions of everything a bug report needs: Python, torch, the ONNX stack, OpenAI Triton,
TensorRT / TensorRT-RTX, CUDA and the GPUs' compute capability."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    from ..env import collect_env, format_env

    from ..serving.environment import server_environment_status

    env = collect_env()
    env["triton_server_env"] = server_environment_status()
    print(json.dumps(env, indent=2) if args.json else format_env(env))
    return 0
