#!/usr/bin/env python3
"""Logits from Hugging Face transformers for a model directory: megadecode's external oracle.

Runs on the GPU machine (torch + transformers installed there), on a directory written by
`megadecode make-model` (or a real checkpoint):

  python3 scripts/hf_reference.py MODEL_DIR --tokens 1,2,3 [--tokens 4,5 ...] \\
      [--positions last|all] [--dtype float32|bfloat16] --out PREFIX
  python3 scripts/hf_reference.py MODEL_DIR --forced-routing ROUTING.json [--dtype ...] --out PREFIX
  python3 scripts/hf_reference.py MODEL_DIR --check-load [--tokens 1,2,3] [--dtype ...]

Each --tokens sequence runs as one full forward pass (no KV cache, no padding, batch of one).
--check-load only loads the model, reports missing/unexpected weights and the parameter count, and
prints one forward's argmax (it shows `make-model` output loads in transformers as is).

--forced-routing runs the sequences of ROUTING.json (instead of --tokens) with the top-k of every
sparse MoE block's gate replaced by the given experts, weighted as the model weighs its own choice,
and audits every (token, layer) where transformers' own top-k set would have differed (the tie gap
of megadecode's model/routing.h). Per model_type:
  qwen3_moe:   every layer sparse; weights: the gate's softmax probabilities at the given experts,
               renormalised when norm_topk_prob; ranked and tie gap on the softmax probabilities.
  cohere2_moe: expert_selection_fn "sigmoid": weights sigmoid(logit) at the given experts,
               renormalised only when norm_topk_prob; transformers ranks by the raw logit (sigmoid
               keeps that order), the tie gap is taken on the sigmoid probabilities (as cpu-ref's
               audit). "softmax": the softmax over the given experts' logits (always normalised).
               Dense layers (mlp_layer_types "dense", no gate) are not routed: the file gives
               [-1] * K for them (what megadecode's routing capture records) and they run as they are.
  ROUTING.json: {"format": "megadecode-routing-v1", "n_layers": L, "top_k": K,
                 "sequences": [{"tokens": [int, ...],                     # n tokens
                                "experts": [[[int] * K] * L] * n}]}       # [token][layer][k]
  Sparse layers: K distinct experts in [0, num_experts); dense layers: exactly [-1] * K.
Every sequence's logits are stored at the last position, and PREFIX.json's sequences gain
  "routing_audit": {"n_forced": int,                        # (token, sparse layer) decisions forced
                    "diffs": [[pos, layer, gap], ...]}      # where transformers' own set differs

Output, PREFIX.json (metadata):
  {
    "format": "megadecode-hf-logits-v1",
    "model_dir": str, "model_class": str, "model_type": str,
    "dtype": "float32" | "bfloat16",       # the dtype the model ran in
    "transformers_version": str, "torch_version": str, "device": str,
    "vocab_size": int,                     # floats per stored position
    "positions": "last" | "all",
    "sequences": [{"tokens": [int, ...],   # the input ids
                   "positions": [int, ...],  # 0-based positions whose logits are stored, in order
                   "offset": int}],        # index (in floats) of the sequence's first value in .f32
    "n_floats": int                        # total floats in PREFIX.f32
  }
and PREFIX.f32: raw little-endian float32; for each sequence in order, for each stored position in
order, vocab_size logits (the prediction of the token after that position), converted to float32.
"""
import argparse
import json
import sys


def parse_tokens(text):
    try:
        ids = [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise SystemExit(f"--tokens {text!r}: expected comma-separated integers")
    if not ids or any(i < 0 for i in ids):
        raise SystemExit(f"--tokens {text!r}: expected one or more non-negative integers")
    return ids


def load_model(model_dir, dtype_name, device):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    # fp32 means fp32: no TF32 in matmuls, eager attention (the most literal implementation).
    torch.set_float32_matmul_precision("highest")
    kwargs = dict(attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kwargs)
    except TypeError:  # transformers before `dtype=` replaced `torch_dtype=`
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, **kwargs)
    model.to(device)
    model.eval()
    return model, info


def forward_logits(model, tokens, device):
    """[len(tokens), vocab] float32 logits of one full forward pass, on the CPU."""
    import torch

    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float().cpu().contiguous()


def float32_bytes(tensor):
    """Little-endian float32 bytes of a CPU float32 tensor."""
    import torch

    assert tensor.dtype == torch.float32, tensor.dtype
    if sys.byteorder != "little":
        raise SystemExit("this script writes little-endian floats; run it on a little-endian machine")
    try:
        return tensor.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without numpy: go through the raw bytes
        return bytes(tensor.view(torch.uint8).flatten().tolist())


# The model types whose routing --forced-routing knows (anything else stops with an error).
ROUTED_MODEL_TYPES = ("qwen3_moe", "cohere2_moe")


def moe_gates(model):
    """The gate (router) module of each layer's sparse MoE block, in layer order; None for a dense
    layer (cohere2_moe's mlp_layer_types "dense": an MLP without a gate)."""
    model_type = model.config.model_type
    if model_type not in ROUTED_MODEL_TYPES:
        raise SystemExit(f"--forced-routing: model_type {model_type!r} is not supported "
                         f"({', '.join(ROUTED_MODEL_TYPES)})")
    if model_type == "qwen3_moe":
        gates = []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is None or not hasattr(gate, "weight"):
                raise SystemExit(f"--forced-routing: layer {i} has no MoE gate with a weight (is this a qwen3_moe model?)")
            gates.append(gate)
        return gates
    # cohere2_moe: Cohere2MoeDecoderLayer.mlp is a Cohere2MoeMLP (dense) or a Cohere2MoeSparseMoeBlock
    # whose .gate is a Cohere2MoeTopKRouter (weight [num_experts, hidden], expert_selection_fn,
    # norm_topk_prob; forward(hidden [n, hidden]) -> (router_logits, scores, selected_experts)).
    kinds = list(getattr(model.config, "mlp_layer_types", None) or [])
    if len(kinds) != len(model.model.layers):
        raise SystemExit(f"--forced-routing: config.mlp_layer_types has {len(kinds)} entries for "
                         f"{len(model.model.layers)} layers")
    gates = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if kinds[i] == "dense":
            if gate is not None:
                raise SystemExit(f"--forced-routing: dense layer {i} has a gate; update scripts/hf_reference.py")
            gates.append(None)
            continue
        if kinds[i] != "sparse":
            raise SystemExit(f"--forced-routing: mlp_layer_types[{i}] is {kinds[i]!r} (dense or sparse)")
        if gate is None or not hasattr(gate, "weight"):
            raise SystemExit(f"--forced-routing: sparse layer {i} has no MoE gate with a weight")
        if getattr(gate, "expert_selection_fn", None) not in ("sigmoid", "softmax"):
            raise SystemExit(f"--forced-routing: layer {i}'s gate has expert_selection_fn "
                             f"{getattr(gate, 'expert_selection_fn', None)!r} (sigmoid or softmax)")
        # The router this script mirrors has no score correction bias, no score scaling and no
        # grouped selection; a transformers that adds one needs this script updated.
        for extra in ("e_score_correction_bias", "routed_scaling_factor", "n_group", "topk_group", "bias"):
            if getattr(gate, extra, None) is not None:
                raise SystemExit(f"--forced-routing: layer {i}'s gate has {extra!r}, which this script does "
                                 "not model; update scripts/hf_reference.py")
        gates.append(gate)
    return gates


def check_routing_file(forced, gates, k, n_experts, path):
    """Every (token, layer) of the routing file: K distinct experts in [0, n_experts) for a sparse
    layer, exactly [-1] * K for a dense one (gate None)."""
    for s, seq in enumerate(forced["sequences"]):
        for t, layers in enumerate(seq["experts"]):
            if len(layers) != len(gates):
                raise SystemExit(f"{path}: sequence {s} token {t} has {len(layers)} layers, the model {len(gates)}")
            for layer, experts in enumerate(layers):
                if not isinstance(experts, list) or len(experts) != k or any(type(e) is not int for e in experts):
                    raise SystemExit(f"{path}: sequence {s} token {t} layer {layer}: {experts!r} is not {k} integers")
                if gates[layer] is None:
                    if experts != [-1] * k:
                        raise SystemExit(f"{path}: sequence {s} token {t} layer {layer} is a dense layer (no "
                                         f"gate); expected {[-1] * k}, got {experts}")
                elif len(set(experts)) != k or any(e < 0 or e >= n_experts for e in experts):
                    raise SystemExit(f"{path}: sequence {s} token {t} layer {layer}: {experts} are not {k} distinct "
                                     f"experts in [0, {n_experts})")


def tie_gap(probs, forced, k, rank=None):
    """megadecode's RouteDiff gap for one token: (largest own-but-not-forced probability minus the
    smallest forced-but-not-own one) / the own K-th probability; None when the sets agree. The own
    top-k is by `rank` when given (the values the model ranks by; ties to the lower expert id), else
    by `probs`."""
    key = probs if rank is None else rank
    order = sorted(range(len(probs)), key=lambda e: (-key[e], e))
    own = set(order[:k])
    forced_set = set(forced)
    dropped = [probs[e] for e in own - forced_set]
    if not dropped:
        return None
    added = [probs[e] for e in forced_set - own]
    return (max(dropped) - min(added)) / max(abs(probs[order[k - 1]]), 1e-30)


class ForcedRouting:
    """Replaces every sparse layer's gate forward: the gate's scores (fp32) recomputed from its weight,
    the given experts as the top-k, weighted as the model weighs its own choice (see the module
    docstring). The original forward runs too, so the returned values keep transformers' own types
    and the first output (router logits) is transformers' own. Dense layers (gate None) are left alone."""

    def __init__(self, model):
        self.model_type = model.config.model_type
        self.gates = moe_gates(model)
        self.experts = None  # [token][layer][k] of the sequence being run
        self.audit = None
        for layer, gate in enumerate(self.gates):
            if gate is None:
                continue
            if self.model_type == "qwen3_moe":
                gate.forward = self._forward(layer, gate, gate.forward)
            else:
                gate.forward = self._forward_cohere2(layer, gate, gate.forward)

    def _forced_ids(self, layer, n, k, device):
        """The routing file's experts of `layer` for the n tokens a top-k gate saw: [n, k] long."""
        import torch

        if self.experts is None or len(self.experts) != n:
            raise SystemExit(f"--forced-routing: the gate of layer {layer} saw {n} tokens, the routing "
                             f"file has {0 if self.experts is None else len(self.experts)}")
        idx = torch.tensor([self.experts[t][layer] for t in range(n)], dtype=torch.long, device=device)
        if idx.shape != (n, k):
            raise SystemExit(f"--forced-routing: {tuple(idx.shape)} experts for a top-{k} gate")
        return idx

    def _forward(self, layer, gate, original):
        import torch
        import torch.nn.functional as F

        def forward(hidden_states):
            out = original(hidden_states)
            if not (isinstance(out, tuple) and len(out) == 3):
                raise SystemExit("--forced-routing: this transformers' MoE gate does not return "
                                 "(router_logits, weights, indices); update scripts/hf_reference.py")
            h = hidden_states.reshape(-1, gate.weight.shape[1])
            probs = F.softmax(F.linear(h.float(), gate.weight.float()), dim=-1, dtype=torch.float32)
            n, k = out[2].shape
            idx = self._forced_ids(layer, n, k, probs.device)
            w = probs.gather(1, idx)
            if getattr(gate, "norm_topk_prob", True):
                w = w / w.sum(dim=-1, keepdim=True)
            host = probs.cpu().tolist()
            for t in range(n):
                self.audit["n_forced"] += 1
                gap = tie_gap(host[t], self.experts[t][layer], k)
                if gap is not None:
                    self.audit["diffs"].append([t, layer, gap])
            return out[0], w.to(out[1].dtype), idx.to(out[2].dtype)

        return forward

    def _forward_cohere2(self, layer, gate, original):
        """Cohere2MoeTopKRouter: logits = hidden @ weight.T, top-k by raw logit; "sigmoid": weights
        sigmoid(logit) at the chosen experts, divided by their sum when norm_topk_prob; "softmax":
        softmax over the chosen experts' logits."""
        import torch
        import torch.nn.functional as F

        def forward(hidden_states):
            out = original(hidden_states)
            if not (isinstance(out, tuple) and len(out) == 3):
                raise SystemExit("--forced-routing: this transformers' Cohere2Moe router does not return "
                                 "(router_logits, scores, selected_experts); update scripts/hf_reference.py")
            h = hidden_states.reshape(-1, gate.weight.shape[1])
            logits = F.linear(h.float(), gate.weight.float())
            n, k = out[2].shape
            if k != gate.top_k or out[1].shape != (n, k):
                raise SystemExit(f"--forced-routing: layer {layer}'s router returned scores {tuple(out[1].shape)} "
                                 f"and experts {tuple(out[2].shape)} for a top-{gate.top_k} router")
            idx = self._forced_ids(layer, n, k, logits.device)
            if gate.expert_selection_fn == "sigmoid":
                probs = torch.sigmoid(logits)
                w = probs.gather(1, idx)
                if gate.norm_topk_prob:
                    w = w / w.sum(dim=-1, keepdim=True)
            else:
                probs = F.softmax(logits, dim=-1, dtype=torch.float32)
                w = F.softmax(logits.gather(1, idx), dim=-1, dtype=torch.float32)
            host_probs = probs.cpu().tolist()
            host_logits = logits.cpu().tolist()
            for t in range(n):
                self.audit["n_forced"] += 1
                gap = tie_gap(host_probs[t], self.experts[t][layer], k, rank=host_logits[t])
                if gap is not None:
                    self.audit["diffs"].append([t, layer, gap])
            return out[0], w.to(out[1].dtype), idx.to(out[2].dtype)

        return forward


def check_load(args, device):
    import torch
    import transformers

    model, info = load_model(args.model_dir, args.dtype, device)
    # Anything missing, unexpected or misshapen means the layout is not exactly HF's.
    problems = {k: v for k, v in info.items()
                if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {type(model).__name__} ({model.config.model_type}), dtype {args.dtype}, device {device}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"parameters: {n_params:,}")
    for key, values in problems.items():
        print(f"loading info: {key}: {list(values)[:10]}{' ...' if len(values) > 10 else ''}")
    tokens = args.tokens[0] if args.tokens else [1, 2, 3]
    logits = forward_logits(model, tokens, device)
    last = logits[-1]
    top = torch.topk(last, 5)
    print(f"tokens {tokens}: argmax of the last position {int(last.argmax())}, "
          f"top-5 {top.indices.tolist()} with logits {[round(v, 4) for v in top.values.tolist()]}")
    print(f"logits: finite {bool(torch.isfinite(logits).all())}, std {float(logits.std()):.4f}, "
          f"max |x| {float(logits.abs().max()):.4f}")
    if problems:
        raise SystemExit("check-load: the checkpoint did not load cleanly (see loading info above)")
    print("check-load: OK")


def dump(args, device):
    import torch
    import transformers

    forced = None
    if args.forced_routing:
        if args.tokens:
            raise SystemExit("--forced-routing takes its sequences from the routing file, not --tokens")
        with open(args.forced_routing) as f:
            forced = json.load(f)
        if forced.get("format") != "megadecode-routing-v1":
            raise SystemExit(f"{args.forced_routing}: not a megadecode-routing-v1 file")
        args.tokens = [s["tokens"] for s in forced["sequences"]]
        for s in forced["sequences"]:
            if len(s["experts"]) != len(s["tokens"]):
                raise SystemExit(f"{args.forced_routing}: {len(s['experts'])} routed tokens for a sequence of "
                                 f"{len(s['tokens'])}")
    if not args.tokens:
        raise SystemExit("give at least one --tokens sequence")
    if not args.out:
        raise SystemExit("--out PREFIX is required")
    model, info = load_model(args.model_dir, args.dtype, device)
    if info.get("missing_keys") or info.get("unexpected_keys"):
        raise SystemExit(f"checkpoint did not load cleanly: {info}")
    router = ForcedRouting(model) if forced else None
    if forced and (forced["n_layers"] != len(router.gates) or forced["top_k"] != model.config.num_experts_per_tok):
        raise SystemExit(f"routing file of {forced['n_layers']} layers x top-{forced['top_k']} for a model of "
                         f"{len(router.gates)} x top-{model.config.num_experts_per_tok}")
    if forced and router.model_type != "qwen3_moe":
        check_routing_file(forced, router.gates, forced["top_k"], model.config.num_experts, args.forced_routing)
    vocab = model.config.vocab_size
    sequences = []
    offset = 0
    with open(args.out + ".f32", "wb") as f:
        for i, tokens in enumerate(args.tokens):
            if max(tokens) >= vocab:
                raise SystemExit(f"token {max(tokens)} is outside the vocabulary ({vocab})")
            if router:
                router.experts = forced["sequences"][i]["experts"]
                router.audit = {"n_forced": 0, "diffs": []}
            logits = forward_logits(model, tokens, device)
            assert logits.shape == (len(tokens), vocab), logits.shape
            positions = list(range(len(tokens))) if args.positions == "all" else [len(tokens) - 1]
            f.write(float32_bytes(logits[positions].contiguous()))
            sequences.append({"tokens": tokens, "positions": positions, "offset": offset})
            if router:
                sequences[-1]["routing_audit"] = router.audit
            offset += len(positions) * vocab
    meta = {
        "format": "megadecode-hf-logits-v1",
        "model_dir": args.model_dir,
        "model_class": type(model).__name__,
        "model_type": model.config.model_type,
        "dtype": args.dtype,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": str(device),
        "vocab_size": vocab,
        "positions": args.positions,
        "sequences": sequences,
        "n_floats": offset,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}.json and {args.out}.f32 ({offset} floats, {len(sequences)} sequences)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--tokens", action="append", type=parse_tokens, default=[],
                   help="comma-separated token ids of one sequence; repeat for more sequences")
    p.add_argument("--positions", choices=["last", "all"], default="last")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--out", help="output prefix: writes PREFIX.json and PREFIX.f32")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--check-load", action="store_true")
    p.add_argument("--forced-routing", help="ROUTING.json: run its sequences with their MoE routing forced")
    args = p.parse_args()

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.check_load:
        check_load(args, device)
    else:
        dump(args, device)


if __name__ == "__main__":
    main()
