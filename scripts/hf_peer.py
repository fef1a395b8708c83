#!/usr/bin/env python3
"""The decode peer: Hugging Face transformers' Qwen3MoeForCausalLM at megadecode's model shape.

Runs on the GPU machine (torch + transformers there). Random bf16 weights (transformers' own
init, built directly on the GPU: no files), a static KV cache, greedy decoding; eager and, where it
works, compiled (generate() compiles the decode step when the cache is static: torch.compile +
CUDA graphs). Decode time is isolated from prefill as

    step_ms = (t(generate 1 + S new tokens) - t(generate 1 new token)) / S

with the same random prompt of --context tokens per sequence, the median of --repeats.

  python3 scripts/hf_peer.py --config-dir DIR [--layers 48] [--context 8192] [--batch 1,8]
      [--steps 64] [--repeats 3] [--modes eager,compiled] --json FILE

DIR holds a config.json (scripts/gpu writes it with `make-model --preset qwen3-30b-a3b
--config-only`; --layers overrides the depth). JSON: a list of records
  {"backend": "hf-eager"|"hf-compiled", "batch", "context", "steps", "step_ms", "tok_s",
   "prefill_s", "transformers_version", "torch_version", "error": str (only when a mode failed)}
"""
import argparse
import json
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-dir", required=True)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--batch", default="1,8")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    a.batch = [int(b) for b in a.batch.split(",")]
    a.modes = a.modes.split(",")
    if any(b < 1 for b in a.batch) or a.context < 1 or a.steps < 1 or a.repeats < 1:
        raise SystemExit("--batch, --context, --steps and --repeats must be positive")
    if any(m not in ("eager", "compiled") for m in a.modes):
        raise SystemExit("--modes: eager and/or compiled")
    return a


def build_model(config_dir, layers):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(config_dir)
    cfg.num_hidden_layers = layers
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
        cfg.layer_types = [cfg.layer_types[0]] * layers
    if hasattr(cfg, "mlp_only_layers"):
        cfg.mlp_only_layers = []
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # never materialise 30B fp32 parameters
    try:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"model: {type(model).__name__}, {layers} layers, {n / 1e9:.2f} B parameters, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB on the GPU", flush=True)
    return model


def timed_generate(model, ids, n_new, compiled):
    import torch

    kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, cache_implementation="static",
                  pad_token_id=0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        try:
            out = model.generate(ids, disable_compile=not compiled, **kwargs)
        except TypeError:  # a transformers without disable_compile: only the eager mode is plain
            if compiled:
                raise
            out = model.generate(ids, **kwargs)
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + n_new, out.shape
    return time.perf_counter() - t0


def measure(model, batch, context, steps, repeats, compiled):
    import torch

    ids = torch.randint(1, model.config.vocab_size, (batch, context), device="cuda")
    timed_generate(model, ids, 1 + steps, compiled)  # warm-up (compiles, captures graphs)
    short = [timed_generate(model, ids, 1, compiled) for _ in range(repeats)]
    long = [timed_generate(model, ids, 1 + steps, compiled) for _ in range(repeats)]
    step_s = (statistics.median(long) - statistics.median(short)) / steps
    return step_s, statistics.median(short)


def main():
    a = parse_args()
    import torch
    import transformers

    model = build_model(a.config_dir, a.layers)
    records = []
    for mode in a.modes:
        for b in a.batch:
            rec = {"backend": f"hf-{mode}", "batch": b, "context": a.context, "steps": a.steps,
                   "transformers_version": transformers.__version__, "torch_version": torch.__version__}
            try:
                step_s, prefill_s = measure(model, b, a.context, a.steps, a.repeats, mode == "compiled")
                rec.update(step_ms=step_s * 1e3, tok_s=b / step_s, prefill_s=prefill_s)
                print(f"hf-{mode:8s} batch {b:2d} context {a.context}: {step_s * 1e3:8.2f} ms/step, "
                      f"{b / step_s:8.1f} tok/s (prefill + 1 token {prefill_s:.2f} s)", flush=True)
            except Exception as e:  # report the mode as failed, keep measuring the others
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"hf-{mode} batch {b}: FAILED: {rec['error']}", flush=True)
            records.append(rec)
            torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump(records, f, indent=1)
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
