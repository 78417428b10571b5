"""The ONNX query encoder: a sentence-transformers model exported once to ONNX (fp32, or int8 by dynamic
quantization), cached on disk, and run by onnxruntime with the model's own fast tokenizer.

The export is the transformer plus the model's pooling (mean or CLS) and L2 normalisation, so it returns the same
unit vectors as ``SentenceTransformer.encode(..., normalize_embeddings=True)``. An export lives in
``<cache_dir>/<backend>-<key>/`` where ``key`` hashes the model's files (``encoder_fingerprint``), the backend and
the export format; it is written into a temporary folder and renamed into place, so a crashed or concurrent export
never leaves a half-written one, and the next start reuses it::

    model.onnx         inputs input_ids / attention_mask (/ token_type_ids), (B, S) int64; output embedding (B, dim)
    tokenizer/         the model's fast tokenizer, with its max length set to the model's max_seq_length
    export.json        backend, model, fingerprint, inputs, dim, format
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

EXPORT_FORMAT = 1
"""Bump when the export's graph or files change, so caches made by older code are not reused."""
OPSET = 17
ONNX_BACKENDS = ("onnx", "onnx-int8")
_POOLINGS = ("mean", "cls")


def _require_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(
            "encoder_backend onnx / onnx-int8 needs onnxruntime and onnx (pip install onnxruntime onnx, or "
            "pip install -e .)"
        ) from e
    return onnxruntime


def _pooled_model(model_path: str) -> tuple[Any, Any, str]:
    """(module returning unit embeddings from token ids, tokenizer, pooling) of a sentence-transformers folder.

    Raises:
        ValueError: the model is not Transformer -> Pooling (mean or cls) [-> Normalize].
    """
    import torch
    from sentence_transformers import SentenceTransformer

    # eager attention exports to plain ONNX ops (MatMul, Softmax)
    st = SentenceTransformer(model_path, device="cpu", model_kwargs={"attn_implementation": "eager"})
    modules: list[Any] = list(st)
    names = [type(m).__name__ for m in modules]
    pooling = modules[1].get_config_dict() if names[:2] == ["Transformer", "Pooling"] else {}
    if names[2:] not in ([], ["Normalize"]) or pooling.get("pooling_mode") not in _POOLINGS:
        raise ValueError(
            f"encoder {model_path!r} is {names} with pooling {pooling}; the ONNX backends export only "
            f"Transformer -> Pooling ({' or '.join(_POOLINGS)}) [-> Normalize]; use encoder_backend=torch for it"
        )
    if not pooling.get("include_prompt", True):
        raise ValueError(f"encoder {model_path!r} pools without its prompt tokens; use encoder_backend=torch for it")
    transformer = modules[0].model.eval()
    mode = str(pooling["pooling_mode"])

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
        ) -> torch.Tensor:
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            if mode == "cls":
                pooled = hidden[:, 0]  # (B, H)
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, S, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    return Pooled().eval(), st.tokenizer, mode


def _export_fp32(model_path: str, out: Path) -> dict[str, Any]:
    """Write ``model.onnx`` and ``tokenizer/`` of the fp32 export into ``out``; returns the export's facts."""
    import torch

    module, tokenizer, pooling = _pooled_model(model_path)
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    sample = tokenizer(["a short query", "a somewhat longer query to pad the first"], padding=True, return_tensors="pt")
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs} | {"embedding": {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter (the dynamo one needs onnxscript) warns that it is deprecated and that it traced
        # Python branches on shapes; the equality tests check the export at several batch sizes and lengths.
        warnings.simplefilter("ignore")
        dim = int(module(*(sample[name] for name in inputs)).shape[1])
        torch.onnx.export(
            module,
            tuple(sample[name] for name in inputs),
            str(out / "model.onnx"),
            dynamo=False,
            input_names=inputs,
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=OPSET,
        )
    tokenizer.save_pretrained(str(out / "tokenizer"))
    return {"inputs": inputs, "dim": dim, "pooling": pooling}


def _quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8 quantization of ``fp32/model.onnx`` into ``out/model.onnx`` (weights per output channel)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the quantizer logs every tensor it visits on the root logger at INFO: hundreds of lines at a server's start
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        # per-tensor scales lose too much on MiniLM (query cosine to fp32 as low as 0.93); per-channel keeps >= 0.98
        quantize_dynamic(fp32 / "model.onnx", out / "model.onnx", weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.disable(previous)
    shutil.copytree(fp32 / "tokenizer", out / "tokenizer")


def export_dir(cache_dir: Path, backend: str, fingerprint: str) -> Path:
    """The folder an export of a model with ``fingerprint`` for ``backend`` is cached in."""
    key = hashlib.sha256(f"{fingerprint}\0{backend}\0{EXPORT_FORMAT}\0{OPSET}".encode()).hexdigest()[:16]
    return cache_dir / f"{backend}-{key}"


def ensure_export(model_path: str, fingerprint: str, backend: str, cache_dir: Path) -> Path:
    """The cached export of the model at ``model_path`` for ``backend``, exported first if missing.

    Raises:
        ValueError: ``backend`` is not an ONNX backend, or the model cannot be exported (see ``_pooled_model``).
    """
    if backend not in ONNX_BACKENDS:
        raise ValueError(f"no ONNX export for backend {backend!r}; ONNX backends are {list(ONNX_BACKENDS)}")
    _require_onnxruntime()
    target = export_dir(cache_dir, backend, fingerprint)
    if (target / "export.json").is_file():
        return target
    fp32 = ensure_export(model_path, fingerprint, "onnx", cache_dir) if backend == "onnx-int8" else None
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        logger.info("exporting encoder %s for backend %s into %s", model_path, backend, target)
        if fp32 is None:
            facts = _export_fp32(model_path, tmp)
        else:
            _quantize_int8(fp32, tmp)
            facts = {k: v for k, v in read_export_facts(fp32).items() if k in ("inputs", "dim", "pooling")}
        facts |= {"backend": backend, "model": model_path, "fingerprint": fingerprint, "format": EXPORT_FORMAT}
        (tmp / "export.json").write_text(json.dumps(facts, indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the index cache beside it is readable by all
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "export.json").is_file():  # not a concurrent export that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_export_facts(folder: Path) -> dict[str, Any]:
    """The ``export.json`` of an export folder."""
    facts: dict[str, Any] = json.loads((folder / "export.json").read_text())
    return facts


class OnnxQueryEncoder:
    """Runs a cached export with onnxruntime on CPU: texts -> (N, dim) float32 unit vectors."""

    def __init__(self, folder: Path, threads: int | None = None) -> None:
        ort = _require_onnxruntime()
        from transformers import AutoTokenizer

        facts = read_export_facts(folder)
        self.inputs: list[str] = list(facts["inputs"])
        self.dim = int(facts["dim"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 0  # 0 = onnxruntime's default, one per physical core
        options.inter_op_num_threads = 1
        # Idle threads sleep instead of spinning: the encoder shares the cores with the event loop and FAISS (c=32,
        # five alternating rounds: 267 vs 252 q/s, p99 655 vs 705 ms; docs/experiments/2026-11-27-retriever-2m.md)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``, longest first (as sentence-transformers does) so each batch
        pads to similar lengths; rows come back in the input order. Shape (N, dim)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            enc = self.tokenizer(
                [texts[i] for i in rows], padding=True, truncation="longest_first", return_tensors="np"
            )
            feed = {name: enc[name].astype(np.int64) for name in self.inputs}
            out[rows] = self.session.run(None, feed)[0]  # (b, dim)
        return out
