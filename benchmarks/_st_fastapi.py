"""The baseline of ``benchmarks/serve.py embeddings``: sentence-transformers behind a minimal
FastAPI app, the way users write it by hand. One endpoint, ``POST /v1/embeddings`` (the
OpenAI request and response shape), ``model.encode`` per request in FastAPI's thread pool
(a plain ``def`` endpoint); no batching across requests.

    python benchmarks/_st_fastapi.py --model-dir DIR --port 8001 --threads 2

``--threads`` sets torch's intra-op threads (``torch.set_num_threads``); the benchmark also
sets OMP / MKL / OpenBLAS thread counts in the environment.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str = "all-MiniLM-L6-v2"


def build(model_dir: str) -> FastAPI:
    model = SentenceTransformer(model_dir, device="cpu")
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embeddings(req: EmbeddingRequest) -> dict[str, Any]:
        texts = [req.input] if isinstance(req.input, str) else req.input
        vecs = model.encode(texts, normalize_embeddings=True)
        return {
            "object": "list",
            "model": req.model,
            "data": [
                {"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vecs)
            ],
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    uvicorn.run(build(a.model_dir), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
