"""Traces from a harness that is not the suite's: the fixtures tests/data/foreign/h200_foreign_*.json.gz.

Plain torch.profiler, as people write it at work: no record_function annotations, shapes recorded only where said,
models from `transformers` built from a config (random weights, no Hub), a training step, worker threads, a graph
break and a recompile, an MLP compiled with max-autotune, and one profile without prof.step(). The reader was not
tuned on any of these; tests/test_foreign_traces.py checks what it says about them against the raw JSON.

Recorded on one NVIDIA H200 with the device image's python3 (torch 2.11, triton 3.6, transformers 5.17), bf16:
    python3 tests/data/foreign/record_h200_foreign.py OUTDIR      # writes OUTDIR/h200_foreign_*.json.gz, about 3 minutes
"""

from __future__ import annotations

import gzip
import shutil
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "foreign")
DEV, DT = "cuda", torch.bfloat16
ACT = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def save(prof, name: str) -> None:
    raw = OUT / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(OUT / f"h200_foreign_{name}.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"wrote h200_foreign_{name}.json.gz", flush=True)


def stepped(name: str, fn, steps: int = 2, shapes: bool = False, **kw) -> None:
    """wait 1, warmup 1, `steps` active, with prof.step(): the common loop, minus the suite's annotations."""
    try:
        _stepped(name, fn, steps, shapes, **kw)
    except Exception as e:  # one failed recording must not cost the others
        print(f"!!! {name}: {type(e).__name__}: {e}", flush=True)


def _stepped(name: str, fn, steps: int, shapes: bool, **kw) -> None:
    with profile(activities=ACT, schedule=schedule(wait=1, warmup=1, active=steps), record_shapes=shapes, **kw) as p:
        for _ in range(2 + steps):
            fn()
            p.step()
    save(p, name)


class MLP(nn.Module):  # the post's GeGLU MLP, written as anyone would
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def decoders() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    llama = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)
    for attn in ("eager", "sdpa"):
        m = LlamaForCausalLM(LlamaConfig(**llama, attn_implementation=attn)).to(DEV, DT).eval()
        ids = torch.randint(0, 32000, (2, 256), device=DEV)
        with torch.inference_mode():
            stepped(f"llama4_prefill_{attn}", lambda: m(ids))
        gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, attn_implementation=attn)).to(DEV, DT).eval()
        ids2 = torch.randint(0, 50257, (2, 128), device=DEV)
        with torch.inference_mode():
            stepped(f"gpt2_{attn}", lambda: gpt(ids2), shapes=True)
        del m, gpt
    # A training step of a 2-layer Llama with a for-loop AdamW: well over 500 launches a step, no shapes.
    m = LlamaForCausalLM(LlamaConfig(**{**llama, "num_hidden_layers": 2})).to(DEV, DT).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)
    ids = torch.randint(0, 32000, (2, 256), device=DEV)

    def train():
        opt.zero_grad(set_to_none=True)
        m(ids, labels=ids).loss.backward()
        opt.step()

    train()
    stepped("llama2_train_forloop", train)


def mlp_runs() -> None:
    torch.manual_seed(0)
    mlp = MLP(768, 3072).to(DEV, DT)
    x = torch.randn(8192, 768, device=DEV, dtype=DT)
    with torch.no_grad():
        stepped("mlp_eager", lambda: mlp(x), steps=3, shapes=True)
        auto = torch.compile(mlp, mode="max-autotune-no-cudagraphs")
        t = time.time()
        for _ in range(3):
            auto(x)
        torch.cuda.synchronize()
        print(f"max-autotune compile: {time.time() - t:.0f} s", flush=True)
        stepped("mlp_autotune", lambda: auto(x), steps=3, shapes=True)

    # Training the MLP with an MSE loss and AdamW (foreach, the default): shapes recorded.
    train_mlp = MLP(768, 3072).to(DEV, DT)
    opt = torch.optim.AdamW(train_mlp.parameters(), lr=1e-4)
    xs, target = torch.randn(4096, 768, device=DEV, dtype=DT), torch.randn(4096, 768, device=DEV, dtype=DT)

    def train():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(train_mlp(xs), target).backward()
        opt.step()

    train()
    stepped("mlp_train_adamw", train, steps=3, shapes=True)

    # Worker threads: two threads run the forward, each on its own stream, while the main thread waits.
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def work(stream):
        with torch.no_grad(), torch.cuda.stream(stream):
            mlp(x[:2048])

    def threaded():
        ts = [threading.Thread(target=work, args=(s,)) for s in (s1, s2)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        torch.cuda.synchronize()

    threaded()
    extra = {}
    try:  # newer torch can follow threads that did not start the profiler (an experimental option)
        extra = {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except TypeError:
        pass
    print(f"threads: {'profile_all_threads' if extra else 'profile_all_threads not in this torch'}", flush=True)
    stepped("threads", threaded, shapes=True, **extra)

    # A graph break and a recompile: the first active step sees a new shape (dynamic=False: frame 0 recompiles).
    def f(a):
        a = F.gelu(a, approximate="tanh") * 2
        torch._dynamo.graph_break()
        return (a @ a.T).relu()

    cf = torch.compile(f, dynamic=False)
    small, big = torch.randn(256, 256, device=DEV, dtype=DT), torch.randn(384, 256, device=DEV, dtype=DT)
    calls = iter([small, small, big, big])
    cf(small)
    stepped("graph_break_recompile", lambda: cf(next(calls)), shapes=True)

    # No prof.step(): one profiled block, as a quick notebook cell would record it.
    with torch.no_grad(), profile(activities=ACT) as p:
        for _ in range(3):
            mlp(x)
        torch.cuda.synchronize()
    save(p, "mlp_bare")


if __name__ == "__main__":
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, transformers {transformers.__version__}",
          flush=True)
    mlp_runs()
    decoders()
